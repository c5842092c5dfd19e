"""The fleet's task YAMLs against SkyPilot's own schemas and parser (offline, no credentials). Needs the fleet extra
(`pip install -c constraints-fleet.txt -e '.[dev,fleet]'`): skipped where SkyPilot is not installed."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from conftest import bench_captured

sky = pytest.importorskip("sky")

from bench.errors import FleetError  # noqa: E402
from bench.fleet import HF_TOKEN, FleetOptions, build_plan, load_yaml, validate_task  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TOKEN = "hf_fleet_schema_token_value_51d0"


def configs(**kw) -> dict:
    base = dict(name="cmp", accelerators=("T4g", "L4", "H100"), bucket="s3://bench-bucket", spot=True,
                checkpoint="google/gemma-4-E2B-it", inputs="41,521", quant=("none", "ple4,int8_lm_head"))  # fmt: skip
    return build_plan(FleetOptions(**{**base, **kw}), REPO)[1]


@pytest.mark.parametrize("kw", [{}, dict(spot=False, bucket=None, checkpoint="builtin:default", quant=()),
                                dict(bucket="gs://b", infra="gcp", checkpoint=None, decode_loop="host")])  # fmt: skip
def test_every_generated_task_is_valid_for_skypilot(kw):
    for name, config in configs(**kw).items():
        validate_task(config, name)
        task = sky.Task.from_yaml_config(copy.deepcopy(config))  # SkyPilot's own reading of what we wrote
        (res,) = task.resources
        assert res.accelerators == {config["resources"]["accelerators"].split(":")[0]: 1}
        assert res.use_spot is config["resources"]["use_spot"]


@pytest.mark.parametrize("edit,needle", [
    (lambda c: c["resources"].update(acceleratorz=c["resources"].pop("accelerators")), "acceleratorz"),
    (lambda c: c["resources"].update(use_spot="maybe"), "use_spot"),
    (lambda c: c["file_mounts"]["/g4b-fleet"].update(mode="MOUNTED"), "MOUNTED"),
    (lambda c: c.update(secrets=[HF_TOKEN]), "secrets"),
    (lambda c: c.update(runn="echo"), "runn"),
])  # fmt: skip
def test_what_the_task_schema_alone_lets_through_is_refused(edit, needle):
    config = copy.deepcopy(configs()["l4.yaml"])
    edit(config)
    with pytest.raises(FleetError, match="l4.yaml") as err:
        validate_task(config, "l4.yaml")
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_plan_command_writes_valid_yamls_and_never_the_token(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(HF_TOKEN, TOKEN)
    out = tmp_path / "fleet" / "cmp"
    code, stdout, err = bench_captured(["fleet", "plan", "--accelerators", "T4g,L4,H100", "--spot", "--bucket",
                                        "s3://bench-bucket", "--checkpoint", "google/gemma-4-E2B-it", "--inputs",
                                        "41,521", "--quant", "none", "--quant", "ple4,int8_lm_head", "--out",
                                        str(out)], capsys)  # fmt: skip
    assert code == 0, err
    assert f"valid against SkyPilot {sky.__version__}'s schema" in stdout and "T4g x1" in stdout
    assert sorted(p.name for p in out.iterdir()) == ["fleet.json", "h100.yaml", "l4.yaml", "t4g.yaml"]
    for p in out.iterdir():
        assert TOKEN not in p.read_text(encoding="utf-8")
    for name in ("h100.yaml", "l4.yaml", "t4g.yaml"):
        validate_task(load_yaml(out / name), name)
        sky.Task.from_yaml(str(out / name))
    assert TOKEN not in stdout + err
