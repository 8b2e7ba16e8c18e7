"""An adapter rewritten in place while it is read is never loaded half old, half new (issue 31, section 2): the
tensors come from the very bytes whose sha256 matched the config read with them, or the read is refused."""
import hashlib
import threading
import time

import torch

from attnft.core.files import CONFIG_FILE, WEIGHTS_FILE
from attnft.methods.freeze.read import read_adapter
from attnft.adapters.store import AdapterStore
from attnft.core.errors import AdapterError
from attnft.methods import parse_method
from attnft.methods.record import AdapterRecord
from tiny_models import tiny_model

ROUNDS, SECONDS = 400, 20.0  # the reader's bound, in reads and in time


def _two_versions(tmp_path):
    """The bytes of one adapter folder in two versions (other attention weights), and each version's tensors."""
    torch.manual_seed(0)
    model = tiny_model("vit")
    applied = parse_method("attn").apply(model)
    store = AdapterStore(tmp_path / "store")
    versions = []
    for version in range(2):
        with torch.no_grad():
            model.blocks[0].attn.qkv.weight.add_(1.0)  # what a second training run would change
        store.save(f"v{version}", model, applied.report, applied.base, AdapterRecord.of(model))
        folder = store.path(f"v{version}")
        versions.append({name: (folder / name).read_bytes() for name in (CONFIG_FILE, WEIGHTS_FILE)})
    tensors = {hashlib.sha256(v[WEIGHTS_FILE]).hexdigest(): read_adapter(store.path(f"v{i}")).tensors
               for i, v in enumerate(versions)}
    return versions, tensors


def test_a_read_during_an_in_place_rewrite_is_whole_or_refused(tmp_path):
    versions, tensors = _two_versions(tmp_path)
    served = tmp_path / "served"
    served.mkdir()
    for name, data in versions[0].items():
        (served / name).write_bytes(data)
    done = threading.Event()

    def rewrite():  # as `cp` would: each file opened and overwritten in place, config and weights one after the other
        i = 0
        while not done.is_set():
            i += 1
            for name in (WEIGHTS_FILE, CONFIG_FILE):
                with open(served / name, "r+b") as f:
                    f.write(versions[i % 2][name])
                    f.truncate()
            time.sleep(0.002)  # a moment whole between rewrites, as a copy tool leaves one between files

    writer = threading.Thread(target=rewrite, daemon=True)
    writer.start()
    whole = refused = 0
    deadline = time.monotonic() + SECONDS
    try:
        for _ in range(ROUNDS):
            if time.monotonic() > deadline:
                break
            try:
                adapter = read_adapter(served)
            except AdapterError:
                refused += 1
                continue
            expected = tensors[adapter.config.weights_sha256]  # the version its config names
            assert adapter.tensors.keys() == expected.keys()
            assert all(torch.equal(adapter.tensors[k], expected[k]) for k in expected), "a torn read was loaded"
            whole += 1
    finally:
        done.set()
        writer.join(timeout=10)
    assert whole > 0  # reads succeed between rewrites; every one of them was one version whole
    assert whole + refused > 10
