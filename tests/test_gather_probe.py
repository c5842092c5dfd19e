"""scripts/probes/gather_layout.py (issue 43's TPU probe of the quantized tables' storage): its reading of compiled
HLO finds a whole-table relayout, and it runs end to end on CPU at small shapes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parents[1] / "scripts" / "probes" / "gather_layout.py"


def _probe():
    spec = importlib.util.spec_from_file_location("gather_layout_probe", PROBE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Two lines as XLA:TPU printed them in the lead's probe (tpu-notes 01): the PLE table and the head relaid.
TPU_HLO = """
ENTRY %main (t: u8[262144,4480], i: s32[1,1]) -> bf16[1,1,8960] {
  %t = u8[262144,4480]{1,0:T(32,128)(4,1)} parameter(0)
  %copy.1 = u8[262144,4480]{1,0:T(8,128)(4,1)} copy(u8[262144,4480]{1,0:T(32,128)(4,1)} %t)
  ROOT copy = s8[262144,1536]{1,0:T(8,128)(4,1)} copy(s8[262144,1536]{1,0:T(32,128)(4,1)} %input)
  %small = f32[1,8960]{1,0} multiply(f32[1,8960]{1,0} %a, f32[1,8960]{1,0} %b)
}
"""


def test_the_probe_finds_whole_table_copies_in_hlo_text():
    found = _probe().hlo_findings(TPU_HLO)
    assert found["layout_op_count"] == 2
    first, second = found["layout_ops"]
    assert (first["name"], first["op"], first["bytes"]) == ("copy.1", "copy", 262_144 * 4480)
    assert first["operands"] == ["u8[262144,4480]"]
    assert (second["op"], second["bytes"]) == ("copy", 262_144 * 1536)
    assert found["layout_op_bytes"] == 262_144 * (4480 + 1536)
    assert [e["name"] for e in found["big_results"]] == ["copy.1", "copy"]  # the parameter itself is not listed


@pytest.mark.slow  # about 20-40 s on 2 cores
def test_the_probe_runs_at_small_shapes(tmp_path, capsys):
    assert _probe().main(["--small", "--calls", "2", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "gather_layout.json").read_text())
    assert res["rows"] == 4096 and res["floor_ms"] > 0
    assert set(res["variants"]) == {"ple4_bytes", "ple4_words", "ple8_bytes", "ple8_words", "head_bytes",
                                    "head_words", "head_dense", "pair_bytes", "pair_words"}  # fmt: skip
    assert res["checks"]["ple4_words_equal_bytes"] and res["checks"]["ple8_words_equal_bytes"]
    assert res["checks"]["head_words_max_abs_diff"] <= 1e-5 * res["checks"]["head_max_abs_logit"]
    assert (tmp_path / "hlo" / "ple4_words.txt").is_file()
    assert "ple4_words" in capsys.readouterr().out


def test_the_probe_refuses_a_missing_output_folder(monkeypatch, capsys):
    monkeypatch.delenv("OUT", raising=False)
    assert _probe().main(["--small"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected an output folder" in err
