"""The GEMM tuning's choices on disk: one file per fingerprint and shape set, read back whole
or not at all, written whole or not at all."""
import json
import logging

import pytest

from hifc.layers.gemm_choices import ChoiceFile, cache_root

FINGERPRINT = {"gpu": "NVIDIA H200", "cublaslt": 130000, "tuning": [128, 0.02]}
SHAPES = [[6144, 4096, "torch.bfloat16", False], [4096, 4096, "torch.bfloat16", False]]
ENTRIES = {(32, 6144, 4096, "torch.bfloat16", False): {"choice": "0a1b", "chosen_us": 15.7},
           (256, 4096, 4096, "torch.bfloat16", False): {"choice": "cublas"}}


def test_the_cache_root_follows_hifc_then_xdg_then_the_home_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("HIFC_CACHE_ROOT", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"
    monkeypatch.delenv("HIFC_CACHE_ROOT")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "hifc"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "hifc"


def test_choices_read_back_as_written_under_the_cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("HIFC_CACHE_ROOT", str(tmp_path))
    store = ChoiceFile(FINGERPRINT, SHAPES)
    assert store.path.parent == tmp_path / "gemm-tuning"
    assert store.read() == {}  # nothing yet
    store.write(ENTRIES)
    assert ChoiceFile(FINGERPRINT, SHAPES[::-1]).read() == ENTRIES  # shapes in any order
    assert [p.name for p in store.path.parent.iterdir()] == [store.path.name]  # no temporary


def test_another_fingerprint_or_shape_set_has_a_file_of_its_own(tmp_path):
    store = ChoiceFile(FINGERPRINT, SHAPES, tmp_path)
    store.write(ENTRIES)
    assert ChoiceFile({**FINGERPRINT, "cublaslt": 130001}, SHAPES, tmp_path).read() == {}
    assert ChoiceFile(FINGERPRINT, SHAPES[:1], tmp_path).read() == {}
    assert store.read() == ENTRIES


@pytest.mark.parametrize("damage", ["truncated", "fingerprint", "format", "key"])
def test_a_damaged_or_foreign_file_is_not_used_and_says_why(tmp_path, caplog, damage):
    store = ChoiceFile(FINGERPRINT, SHAPES, tmp_path)
    store.write(ENTRIES)
    text = store.path.read_text()
    data = json.loads(text)
    if damage == "truncated":
        text = text[:len(text) // 2]
    else:
        if damage == "fingerprint":  # another file's content under this name
            data["fingerprint"]["gpu"] = "NVIDIA H100"
        elif damage == "format":
            data["format"] = 0
        else:
            data["entries"][0]["key"][0] = "32"
        text = json.dumps(data)
    store.path.write_text(text)
    with caplog.at_level(logging.WARNING, logger="hifc.layers.gemm_choices"):
        assert store.read() == {}
    assert "timing the shapes again" in caplog.text
    store.write(ENTRIES)  # the next tuning replaces it
    assert store.read() == ENTRIES


def test_a_file_that_cannot_be_written_is_a_warning_not_an_error(tmp_path, caplog):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    store = ChoiceFile(FINGERPRINT, SHAPES, blocker / "gemm-tuning")
    with caplog.at_level(logging.WARNING, logger="hifc.layers.gemm_choices"):
        store.write(ENTRIES)
    assert "not saved" in caplog.text
    assert store.read() == {}


def test_a_file_left_unreplaced_leaves_no_temporary_behind(tmp_path, caplog):
    store = ChoiceFile(FINGERPRINT, SHAPES, tmp_path)
    store.path.mkdir()  # a rename onto a directory fails
    with caplog.at_level(logging.WARNING, logger="hifc.layers.gemm_choices"):
        store.write(ENTRIES)
    assert "not saved" in caplog.text
    assert list(tmp_path.iterdir()) == [store.path]
