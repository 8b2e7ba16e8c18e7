"""A config larger than any adapter's (64 MB) is refused before it is read: one line from verify and the store, and
the server answers for it without holding it in memory."""
import os

import pytest

from attnft.adapters.store import AdapterStore
from attnft.cli import main
from attnft.core.errors import AdapterError
from attnft.core.files import CONFIG_FILE
from attnft.core.folders import CONFIG_MAX_BYTES
from serve_helpers import save_attn_adapter


def test_a_config_over_64_mb_is_one_line_and_never_read(tmp_path, capsys):
    store = AdapterStore(tmp_path / "store")
    save_attn_adapter(store, "huge", 3, 0)
    with open(store.path("huge") / CONFIG_FILE, "r+b") as f:
        f.truncate(CONFIG_MAX_BYTES + 1)  # sparse: no disk used
    with pytest.raises(AdapterError, match="an adapter's config is at most 64 MB"):
        store.config("huge")
    capsys.readouterr()
    assert main(["adapters", "verify", "huge", "--store", str(store.root)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "at most 64 MB" in err
    assert os.path.getsize(store.path("huge") / CONFIG_FILE) == CONFIG_MAX_BYTES + 1  # nothing changed
