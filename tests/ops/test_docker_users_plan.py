"""docker_users: the docker stage adds each user to the docker group once (Ubuntu 24.04 Desktop
and Debian 12), never one already in it, and preflight refuses a user the box lacks before the
first stage changes anything.

The users' facts are `id -nG` lines as gpubox.knowledge.users.groups_command prints them (``NAME:``
and
the groups; nothing after the colon for a user the box does not have). The desktop owner's
groups are the ones Ubuntu's desktop installer gives the first user (adm cdrom sudo dip
plugdev users lpadmin); only the presence of docker decides anything here."""

from __future__ import annotations

import pytest
from conftest import REFERENCE, fake_host, fresh_box
from test_container_stages_plan import NO_DOCKER
from test_desktop_plan import hwe_desktop

from gpubox.base.errors import DeployRefused
from gpubox.stages import docker as docker_stage
from gpubox.stages import driver as driver_stage
from gpubox.stages import run_stages

GROUPS = "id -nG --"  # a part of the UserGroups fact's command (the fake answers by part)
OWNER = "owner:owner adm cdrom sudo dip plugdev users lpadmin"


def test_the_desktop_owner_is_added_to_the_docker_group_after_docker_is_installed(plan_of):
    data = {**REFERENCE, "docker_users": ["owner"]}
    plan = plan_of(docker_stage.docker, data, hwe_desktop(**NO_DOCKER, **{GROUPS: [OWNER]}))
    commands = plan.op(r"docker_users: add owner")
    assert commands == [
        "getent group docker >/dev/null || groupadd --system docker; usermod -aG docker owner"
    ]
    names = plan.names
    added = names.index(next(n for n in names if "docker_users: add owner" in n))
    installed = names.index(next(n for n in names if "Install Docker Engine" in n))
    assert installed < added
    assert names[added].endswith("(from owner's next login)")


def test_on_debian_only_the_users_not_yet_in_the_group_are_added(plan_of):
    data = {**REFERENCE, "docker_users": ["alice", "bob"]}
    groups = ["alice:alice users docker", "bob:bob users"]
    plan = plan_of(
        docker_stage.docker, data, fresh_box("debian12", **NO_DOCKER, **{GROUPS: groups})
    )
    added = [n for n in plan.names if "docker_users:" in n]
    assert added == ["Docker | docker_users: add bob to the docker group (from bob's next login)"]
    assert plan.op("docker_users: add bob")[0].endswith("usermod -aG docker bob")


def test_a_second_run_adds_nobody(plan_of):
    data = {**REFERENCE, "docker_users": ["owner"]}
    member = [OWNER + " docker"]
    plan = plan_of(docker_stage.docker, data, hwe_desktop(**NO_DOCKER, **{GROUPS: member}))
    assert not [n for n in plan.names if "docker_users" in n]
    assert not [c for c in plan.commands if "usermod" in c]


def test_without_docker_users_nobody_is_asked_about(plan_of, commands):
    plan_of(docker_stage.docker, REFERENCE, fresh_box("debian12", **NO_DOCKER))
    assert not [c for c in commands if GROUPS in c]


@pytest.mark.parametrize("os_name", ["ubuntu2404", "debian12"])
def test_a_user_the_box_lacks_is_refused_before_the_first_change(os_name):
    data = {**REFERENCE, "docker_users": ["owner", "ghost"]}
    facts = fresh_box(os_name, **NO_DOCKER, **{GROUPS: [OWNER, "ghost:"]})
    with fake_host(data, facts) as fake, pytest.raises(DeployRefused) as refused:
        # the first stage of deploy/full.py: preflight runs there, for every stage
        run_stages(driver_stage.driver)
    # pyinfra plans every operation before it runs one: the refusal ends the run at the plan,
    # where the only operation is dpkg_ready's apt lock timeout (gpubox.preflight.dpkg_ready), first
    planned = [" ".join(fake.state.op_meta[h].names) for h in fake.state.get_op_order()]
    assert all("dpkg's lock" in n for n in planned), planned
    message = str(refused.value)
    assert "preflight failed, nothing was changed" in message
    assert (
        "box: docker_users: no user 'ghost' on the box: create it first (sudo adduser ghost), "
        "or take it out of docker_users"
    ) in message
    assert "'owner'" not in message
