"""The API's `tokenshop` commands, run as the operator runs them (the `tokenshop` fixture)."""

from __future__ import annotations


def test_export_model_refuses_bad_arguments_in_one_line(tokenshop, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "model.onnx").write_text("x")
    for args in (
        ("export-model", "some/model", str(tmp_path / "new"), "--quantize", "int3"),
        ("export-model", "some/model", str(taken)),
    ):
        result = tokenshop(*args)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("tokenshop: error: ")
        assert result.stderr.count("\n") == 1


def test_serve_refuses_a_port_that_is_not_a_number_in_one_line(tokenshop):
    result = tokenshop("serve", "--port", "eighty")
    assert result.returncode == 2
    assert result.stderr.startswith("tokenshop: error: ")
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr
