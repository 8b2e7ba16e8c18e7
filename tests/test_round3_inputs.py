"""Robustness, round three, section 3: training flags and data that used to be ignored, crash or say the wrong thing
are one line and exit 2, with nothing written."""
import json
import os

import pytest

from attnft.cli import main
from test_runner import _fails_cleanly


def _tiny(tmp_path, *extra):
    return ["finetune", "--model", "vit_fmnist_patch4_28", "--max-train", "64", "--max-eval", "32", "--steps", "1",
            "--batch-size", "32", "--workers", "0", "--no-progress", "--output-dir", str(tmp_path / "run"),
            "--store", str(tmp_path / "store"), *extra]


@pytest.mark.parametrize("flags", [["--model-ema-decay", "0.5"], ["--model-ema-warmup"]])
def test_ema_settings_without_model_ema_are_refused(capsys, tmp_path, flags):
    _fails_cleanly(capsys, _tiny(tmp_path, *flags), words=["add --model-ema"], untouched=[tmp_path])
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_or_recipe_that_is_no_regular_file_is_named_for_what_it_is(capsys, tmp_path):
    os.mkfifo(tmp_path / "fifo")  # outside the folder checked untouched: reading a FIFO would block
    work = tmp_path / "work"
    work.mkdir()
    for flags, words in ((["--checkpoint", "/dev/zero"], ["/dev/zero is a device"]),
                         (["--checkpoint", str(tmp_path / "fifo")], ["is a FIFO"]),
                         (["--recipe", "/dev/null"], ["recipe /dev/null is a device"]),
                         (["--recipe", str(work / "none.yaml")], ["not found"])):
        _fails_cleanly(capsys, _tiny(work, *flags), words=words, untouched=[work])
    assert not any(work.iterdir())


def test_the_root_of_the_file_system_as_a_dataset_is_one_line(capsys, tmp_path):
    _fails_cleanly(capsys, _tiny(tmp_path, "--dataset", "/"), words=["cannot read local copy / as a dataset"],
                   untouched=[tmp_path])
    _fails_cleanly(capsys, ["eval", "--model", "vit_fmnist_patch4_28", "--dataset", "/", "--workers", "0"],
                   words=["cannot read local copy / as a dataset"], untouched=[tmp_path])


def test_eval_of_an_adapter_whose_data_config_makes_logits_non_finite_is_refused_by_field(capsys, tmp_path):
    """A mean of 1e308 made every logit NaN, scored as one class (top-1 6.25, exit 0): now refused by its field,
    and a model whose logits are not finite anyway is an error naming it (commands/evaluate.py)."""
    assert main(_tiny(tmp_path, "--name", "broken")) == 0
    config = tmp_path / "store" / "broken" / "adapter_config.json"
    data = json.loads(config.read_text())
    data["data_config"]["mean"] = [1e308] * 3
    config.write_text(json.dumps(data))
    _fails_cleanly(capsys, ["eval", "--adapter", "broken", "--store", str(tmp_path / "store"), "--max-eval", "32",
                            "--workers", "0"], words=["broken", "data_config.mean must be"], untouched=[tmp_path])


@pytest.mark.parametrize("flags, words", [(["--epochs", "\u0663"], "invalid int value"),
                                          (["--lr", "\u0661.\u0665"], "invalid float value"),
                                          (["--background", "\u0661,\u0662,\u0663"], "background must be")])
def test_numbers_are_ascii_digits_only(capsys, tmp_path, flags, words):
    try:
        code = main(_tiny(tmp_path, *flags))
    except SystemExit as e:  # argparse's own refusal, one line and exit 2 (attnft.cli's parser)
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err, err
    assert not (tmp_path / "run").exists()


def test_a_policy_spec_of_ten_thousand_characters_is_refused_before_anything(capsys, tmp_path):
    _fails_cleanly(capsys, _tiny(tmp_path, "--policy", "attn" + "+norm" * 2000), words=["at most 256"],
                   untouched=[tmp_path])


def test_the_server_reads_top_k_in_ascii_digits_only():
    from attnft.server.inputs import RequestError, check_top_k

    assert check_top_k("3", 5) == 3
    with pytest.raises(RequestError, match="top_k must be an integer"):
        check_top_k("\u0663", 5)


def test_every_decompression_bomb_quotes_the_one_pixel_limit():
    from PIL import Image

    from attnft.data import decode_image
    from serve_helpers import png_header

    limit = f"{Image.MAX_IMAGE_PIXELS:,}"
    for width in (10_000, 30_000):  # PIL warns about the first, refuses the second (beyond twice its limit) itself
        with pytest.raises(Image.DecompressionBombError, match=f"over the limit of {limit} pixels"):
            decode_image(png_header(width, width), max_pixels=Image.MAX_IMAGE_PIXELS)


def test_a_store_on_a_virtual_file_system_is_named_for_what_it_is(capsys, tmp_path):
    _fails_cleanly(capsys, _tiny(tmp_path, "--store", "/proc"), words=["virtual file system"], untouched=[tmp_path])
