"""``attnft serve`` under what a robustness review (issue 39) threw at it: a real server process on a free port of
127.0.0.1, real HTTP and real sockets.

The store holds a 28 px task of the bundled ``vit_fmnist_patch4_28`` and a 224 px one of ``vit_fmnist_patch32_224``
(a 7x7 grid at 224 px: a forward pass costs what the 28 px one does).
"""
import io

import pytest
from PIL import Image

from attnft.adapters.store import AdapterStore
from attnft.bundled import BUNDLED_MODEL_224
from serve_helpers import Server, peak_rss_mb, png, save_attn_adapter


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    store = AdapterStore(tmp_path_factory.mktemp("robust") / "adapters")
    save_attn_adapter(store, "shirts", 5, 0)
    save_attn_adapter(store, "wide", 4, 1, base=BUNDLED_MODEL_224)
    return store


@pytest.fixture(scope="module")
def server(store, tmp_path_factory):
    with Server(store, tmp_path_factory.mktemp("server")) as server:
        yield server


def _png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (width, height), 128).save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_100000x1_and_a_1x100000_png_cost_the_server_their_source_and_output_not_their_resize(server):
    """timm's eval resize would make 100000x1 22,400,000x224 pixels at 224 px and 2,800,000x28 at 28 px (235 MB of
    RGB, under PIL's pixel limit) before keeping the centre: the crop's box is resampled instead, and both answer."""
    thin = [_png(100_000, 1), _png(1, 100_000)]
    assert all(len(data) < 2000 for data in thin)
    for task in ("wide", "shirts"):  # each base created, its adapter loaded, a forward run: the peak settled
        assert server.classify(task, png(1, size=224 if task == "wide" else 28)).status_code == 200
    before = peak_rss_mb(server.process.pid)
    for task in ("wide", "shirts"):
        for data in thin:
            response = server.classify(task, data)
            assert response.status_code == 200, response.text
    assert peak_rss_mb(server.process.pid) - before < 50
