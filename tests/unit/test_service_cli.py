"""``marlaas service`` operator commands, the service config, and the small pure
pieces (filename sanitizing, the default grader check)."""

from __future__ import annotations

import pytest

from areal_marlaas.config.service import ServiceConfig
from areal_marlaas.errors import ConfigError
from areal_marlaas.graders import GraderError, GradingContext
from areal_marlaas.service.auth import is_admin
from areal_marlaas.service.cli import load_service_config, main
from areal_marlaas.service.grading import service_grader_validator
from areal_marlaas.service.store import JobStore, NewJob
from areal_marlaas.service.uploads import sanitize_filename


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_tenant_add_prints_a_key_once_and_stores_its_hash(tmp_path, capsys):
    root = f"service.root={tmp_path}"
    rc, out, err = run(capsys, "tenant", "add", "acme", root)
    key = out.strip()
    assert rc == 0 and key.startswith("sk-marlaas-") and "shown only now" in err
    store = JobStore(f"sqlite:///{tmp_path / 'service.db'}", tmp_path)
    assert store.authenticate(key).name == "acme"
    assert key not in (tmp_path / "service.db").read_text(errors="replace")
    rc, out, _ = run(capsys, "tenant", "list", root)
    assert rc == 0 and out.startswith("acme\torg-") and key[:15] in out
    rc, _, err = run(capsys, "tenant", "add", "acme", root)
    assert rc == 1 and "already exists" in err
    rc, out, _ = run(capsys, "tenant", "key", "acme", root)
    second = out.strip()
    assert store.authenticate(second).name == "acme"
    rc, _, err = run(capsys, "tenant", "revoke", "acme", root)
    assert rc == 0 and "2 key(s) of acme revoked" in err
    assert store.authenticate(key) is None and store.authenticate(second) is None
    rc, _, err = run(capsys, "tenant", "revoke", "nobody", root)
    assert rc == 1 and "No such tenant" in err
    store.close()


def test_admin_key_and_status_read_the_yaml_service_section(tmp_path, capsys):
    cfg_file = tmp_path / "svc.yaml"
    cfg_file.write_text(
        f"experiment_name: x\nservice:\n  root: {tmp_path}\n  port: 9001\n"
    )
    rc, out, _ = run(capsys, "--config", str(cfg_file), "admin-key")
    admin = out.strip()
    assert rc == 0 and is_admin(tmp_path / "admin_key.sha256", admin)
    assert not is_admin(tmp_path / "admin_key.sha256", admin + "x")
    rc, out, _ = run(capsys, "status", "--config", str(cfg_file))
    assert rc == 0 and out.strip() == "0 tenant(s), 0 job(s)"
    store = JobStore(f"sqlite:///{tmp_path / 'service.db'}", tmp_path)
    tenant, _ = store.create_tenant("acme")
    f = store.add_file(tenant.id, "t.jsonl", "fine-tune", b"{}\n", 1)
    job, _ = store.create_job(
        tenant.id,
        NewJob("m", f.id, None, {}, {}, None, 0, None, steps_total=5),
    )
    store.set_status(job.id, "queued")
    store.set_status(job.id, "running")
    store.record_step(job.id, 2)
    rc, out, _ = run(capsys, "status", "--config", str(cfg_file))
    assert "1 tenant(s), 1 job(s)" in out
    line = next(line for line in out.splitlines() if job.id in line)
    assert line.split()[:4] == ["acme", job.id, "running", "2/5"]
    store.close()


def test_config_errors_name_the_field(tmp_path, capsys):
    rc, _, err = run(capsys, "status", f"service.root={tmp_path}", "service.port=-1")
    assert rc == 2 and "service.port" in err
    rc, _, err = run(capsys, "status", "port=1")
    assert rc == 2 and "unknown field 'port'" in err
    rc, _, err = run(capsys, "status", f"service.root={tmp_path}", "service.nope=1")
    assert rc == 2 and "nope" in err
    with pytest.raises(ConfigError, match="service.max_queued_jobs"):
        ServiceConfig(max_queued_jobs=0)
    with pytest.raises(ConfigError, match="service.default_learning_rate_multiplier"):
        ServiceConfig(default_learning_rate_multiplier=float("nan"))
    with pytest.raises(ConfigError, match="service.group_size_per_multiplier"):
        ServiceConfig(group_size_per_multiplier=1)
    cfg = load_service_config(None, [f"service.root={tmp_path}"]).service
    assert cfg.database_url == f"sqlite:///{tmp_path / 'service.db'}"
    assert cfg.admin_key_path == tmp_path / "admin_key.sha256"


@pytest.mark.parametrize(
    "name, stored",
    [
        ("train.jsonl", "train.jsonl"),
        ("../../etc/passwd", "passwd"),
        ("C:\\Users\\x\\data.jsonl", "data.jsonl"),
        ("bad\x00na\x1bme\n.jsonl", "badname.jsonl"),
        ("..", "upload.jsonl"),
        ("", "upload.jsonl"),
        (None, "upload.jsonl"),
        ("x" * 300, "x" * 255),
    ],
)
def test_sanitize_filename(name, stored):
    assert sanitize_filename(name) == stored


def test_service_grader_validator():
    check = service_grader_validator(["addition"], GradingContext())
    check(
        {
            "type": "string_check",
            "name": "a",
            "input": "x",
            "reference": "y",
            "operation": "ilike",
        }
    )
    check({"type": "marlaas", "kind": "addition"})
    where = "method.reinforcement.grader"
    bad = [
        ({"type": "nope", "source": "x"}, f"{where}.type"),
        ({"type": "marlaas", "kind": "gsm8k"}, f"{where}.kind"),
        (
            {"type": "marlaas", "kind": "addition", "import": "os.system"},
            f"{where}.import",
        ),
        (
            {
                "type": "string_check",
                "name": "a",
                "input": "x",
                "reference": 1,
                "operation": "eq",
            },
            f"{where}.reference",
        ),
        (
            {
                "type": "string_check",
                "name": "a",
                "input": "x",
                "reference": "y",
                "operation": "re",
            },
            f"{where}.operation",
        ),
        (
            {
                "type": "multi",
                "name": "m",
                "graders": {"k": {"type": "marlaas", "kind": "addition"}},
                "calculate_output": "k",
            },
            f"{where}.graders.k.type",
        ),
    ]
    for spec, param in bad:
        with pytest.raises(GraderError) as e:
            check(spec)
        assert e.value.param == param and isinstance(e.value, ValueError)
