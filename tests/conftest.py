import atexit
import os
import shutil
import sys
import tempfile

# Tests never reach a hub: fail fast instead of retrying for a minute.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# idle OpenMP threads sleep instead of spinning against subprocesses the tests start (see attnft/cli.py)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# image-folder indexes go to a folder of this session, not the user's ~/.cache/attnft (subprocesses inherit it)
os.environ["ATTNFT_CACHE_DIR"] = tempfile.mkdtemp(prefix="attnft-test-cache-")
atexit.register(shutil.rmtree, os.environ["ATTNFT_CACHE_DIR"], ignore_errors=True)

sys.path.insert(0, os.path.dirname(__file__))  # tiny_models helpers

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def postgres_url():
    """The URL of a real PostgreSQL server (tests/postgres.py); skipped where the package is missing, except in CI,
    whose set-up installs it (.ci/run): there its absence fails the test."""
    from postgres import PostgresServer

    server = PostgresServer()
    if not server.available:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL is not installed: .ci/run installs Debian's postgresql package")
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    url = server.start()
    yield url
    server.stop()
