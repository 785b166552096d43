"""The deploy's final checks report the deploy's end to the monitoring (gpubox.stages.verify,
issue 31 C5): on a monitored fleet the operation writes gpubox-deploy.prom through the
connection while the run executes (never while pyinfra plans), success 0 before it fails on a
failed check, and yields no command: a converged re-deploy still reports no change."""

from __future__ import annotations

import pytest
from conftest import REFERENCE, fake_host, fresh_box
from pyinfra.api import OperationError

from gpubox.ops import box_metrics
from gpubox.stages import verify


def execute(data, monitored: bool, monkeypatch, commands) -> list[str]:
    """verify() planned (pyinfra -y: no change check while planning), then its operation
    executed; the commands sent while it executed. The fake box answers none of the checks'
    reads: every check fails."""
    monkeypatch.setattr(box_metrics, "monitored", lambda hosts=None: monitored)
    with fake_host(data, fresh_box("ubuntu2404")) as fake:
        fake.state.check_for_changes = False
        verify.verify()
        assert not [c for c in commands if "gpubox-deploy.prom" in c]  # nothing while planning
        (op_hash,) = fake.state.get_op_order()
        fake.state.is_executing = True
        start = len(commands)
        op = fake.state.get_op_data_for_host(fake.host, op_hash)
        yielded = []
        with pytest.raises(OperationError, match="quick checks failed after the deploy"):
            yielded.extend(op.command_generator())
        assert yielded == []
        return commands[start:]


def test_a_failed_check_run_writes_success_0_before_the_operation_fails(monkeypatch, commands):
    sent = execute(REFERENCE, True, monkeypatch, commands)
    reads = [c for c in sent if c.startswith("cat /var/lib/prometheus/node-exporter/")]
    writes = [c for c in sent if "gpubox_deploy_last_run_success 0" in c]
    assert reads == ["cat /var/lib/prometheus/node-exporter/gpubox-deploy.prom 2>/dev/null || true"]
    assert len(writes) == 1
    assert "mv -f /var/lib/prometheus/node-exporter/gpubox-deploy.prom.tmp " in writes[0]


def test_no_monitor_no_textfile(monkeypatch, commands):
    sent = execute(REFERENCE, False, monkeypatch, commands)
    assert not [c for c in sent if "gpubox-deploy.prom" in c]


def test_without_the_checks_a_monitored_fleet_still_reports_the_deploys_end(monkeypatch, commands):
    monkeypatch.setattr(box_metrics, "monitored", lambda hosts=None: True)
    data = {**REFERENCE, "verify_after_deploy": False}
    with fake_host(data, fresh_box("ubuntu2404")) as fake:
        fake.state.check_for_changes = False
        verify.verify()
        (op_hash,) = fake.state.get_op_order()
        fake.state.is_executing = True
        op = fake.state.get_op_data_for_host(fake.host, op_hash)
        assert list(op.command_generator()) == []
    assert [c for c in commands if "gpubox_deploy_last_run_success 1" in c]
    monkeypatch.setattr(box_metrics, "monitored", lambda hosts=None: False)
    with fake_host(data, fresh_box("ubuntu2404")) as fake:
        verify.verify()
        assert fake.state.get_op_order() == []


def test_the_file_goes_through_pyinfras_own_connection_exactly(tmp_path):
    """pyinfra's @local connector (its real run_shell_command and quoting): the text read back
    is the text written, a path with a space and the file's quotes included."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all

    from gpubox.knowledge import metrics

    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config())
    connect_all(state)
    (local,) = list(inventory)
    path = tmp_path / "node exporter" / "gpubox-deploy.prom"
    assert verify.write_status(local, {}, str(path), True, True) is None
    assert verify.write_status(local, {}, str(path), False, True) is None
    text = path.read_text()
    values = metrics.read_values(text)
    assert values["gpubox_deploy_last_run_success"] == 0
    assert values["gpubox_deploy_last_success_timestamp_seconds"] > 0  # kept from the first
    assert text == verify.status_text(text, False, True, values[verify.DEPLOY_METRICS[0]])
