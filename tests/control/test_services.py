"""The control-plane services' contract on the driver's side (replication.control.services): a
service added to the job master gets its part of every heartbeat and gives its word in every
reply, with neither the heartbeat handler nor the other services changed."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from replication import heartbeat_parts as parts
from replication.control.services import DriverServices
from replication.heartbeat_parts import DrainPositions, Holding, MeasureRequests
from replication.messages import Heartbeat, Instructions
from tests.control.test_job_master import _master, _replicas
from transport import wire


@wire.record
@dataclass(frozen=True)
class Greeting:
    text: str


class Greeter:
    """A service that is in no module of the library: it hears each worker and answers them all."""

    name = "greeter"

    def __init__(self) -> None:
        self.heard: list[tuple[int, Greeting | None]] = []

    def on_report(self, worker: int, part: Greeting | None) -> None:
        self.heard.append((worker, part))

    def reply(self) -> Greeting | None:
        return Greeting(f"heard {len(self.heard)}") if self.heard else None


def test_a_new_service_gets_its_part_of_every_beat_and_gives_its_word_in_every_reply():
    master = _master(rhino=True, workers=3)
    greeter = Greeter()
    master.services.add(greeter)
    reply = master.heartbeat(Heartbeat(worker=1, attempt=0, parts={"greeter": Greeting("hi")}))
    assert reply.parts["greeter"] == Greeting("heard 1")
    reply = master.heartbeat(Heartbeat(worker=2, attempt=0))  # nothing new from worker 2: None, on every beat
    assert greeter.heard == [(1, Greeting("hi")), (2, None)] and reply.parts["greeter"] == Greeting("heard 2")
    # the services that were there answer as before, next to it
    assert set(reply.parts) == {parts.OUTPUTS, parts.CHECKPOINTS, "greeter"}


def test_every_reply_and_heartbeat_crosses_the_wire_whole():
    """The parts are registered records: a beat and a reply carrying every service's part decode to
    what was sent (a part the wire did not know would be refused, not unpickled)."""
    master = _master(rhino=True, workers=3)
    source = _replicas(master, "source-a")[0]
    master.measurements.request(3)
    beat = Heartbeat(worker=master.placement[source], attempt=0, errors=[], rpc_refused=2, parts={
        parts.PULSE_WINDOWS: Holding({source: (1, {0: 5})}), parts.DRAINS: DrainPositions({source: {0: 9}})})
    reply = master.heartbeat(beat)
    assert wire.decode(wire.encode(beat), Heartbeat) == beat
    assert wire.decode(wire.encode(reply), Instructions) == reply
    assert reply.parts[parts.STATE_MEASUREMENT] == MeasureRequests({3: 1})
    assert master.windows.holding[source] == (1, {0: 5}) and master.drains.positions[source] == {0: 9}


def test_a_report_for_a_service_the_driver_does_not_run_is_refused_by_name():
    master = _master(rhino=False, workers=3)
    with pytest.raises(ValueError, match=r"services this driver does not run: \['checkpoints'\]"):
        master.heartbeat(Heartbeat(worker=0, attempt=0, parts={parts.CHECKPOINTS: parts.CheckpointReport()}))


def test_two_services_of_one_name_are_refused():
    services = DriverServices([Greeter()])
    with pytest.raises(ValueError, match="two control-plane services are named 'greeter'"):
        services.add(Greeter())


def test_the_driver_runs_a_service_of_every_name_the_parts_define():
    """Every pair of parts has its service on the driver (checkpoints with Rhino only)."""
    names = {v for k, v in vars(parts).items() if k.isupper() and isinstance(v, str)}
    with_rhino = _master(rhino=True, workers=3).services
    without = _master(rhino=False, workers=3).services
    assert set(with_rhino.names()) == names
    assert set(without.names()) == names - {parts.CHECKPOINTS}
