"""The Ray backend's monitor loop paces its log ticks (no cluster: a fake ``ray`` whose
``wait`` answers at once, as Ray does when an idle actor has nothing new, and a fake
clock that only moves when the loop sleeps)."""

from __future__ import annotations

import types

import pytest

from shipyard.backends.ray import backend as ray_backend


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


class _Actor:
    """An instance whose agent ends at ``ends_at`` (fake seconds), logging nothing."""

    def __init__(self, clock: _Clock, ends_at: float) -> None:
        self.clock, self.ends_at, self.ticks = clock, ends_at, 0
        self.tick = types.SimpleNamespace(remote=self._tick)

    def _tick(self) -> tuple[bytes, int | None]:
        self.ticks += 1
        if self.ticks > 10_000:  # the unpaced loop: the fake clock never moves
            raise RuntimeError("the monitor asked for ticks without ever pausing")
        return b"", (0 if self.clock.now >= self.ends_at else None)


def _fake_ray() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        wait=lambda refs, num_returns, timeout: (list(refs), []),
        get=lambda ref: ref,  # the "ref" is the tick's answer itself
        exceptions=types.SimpleNamespace(RayError=RuntimeError),
    )


def _watch(monkeypatch, ends_at: float, count: int = 2) -> tuple[list[_Actor], list[float]]:
    """Run the monitor over ``count`` instances; the actors and when each was collected."""
    clock = _Clock()
    monkeypatch.setattr(
        ray_backend, "time", types.SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep)
    )
    actors = [_Actor(clock, ends_at) for _ in range(count)]
    launch = ray_backend._Launch(pg=None)
    for k, actor in enumerate(actors):
        launch.instances.append(
            ray_backend._Instance(f"algo-{k + 1}", actor, "/nonexistent.log", "/x", "ip", "id")
        )
    collected: list[float] = []

    def collect(ray, inst, code):
        collected.append(clock.now)
        inst.code = code

    backend = ray_backend.RayBackend.__new__(ray_backend.RayBackend)
    monkeypatch.setattr(backend, "_collect", collect)
    backend._watch(_fake_ray(), launch)
    assert [i.code for i in launch.instances] == [0] * count
    return actors, collected


def test_idle_instances_are_asked_for_logs_at_most_every_fifth_of_a_second_once_quiet(
    monkeypatch,
):
    """10 s of a job that logs nothing: about 10 / 0.2 ticks per instance (a few more
    while the interval grows from 0.01 s), not one per Ray round trip."""
    actors, _ = _watch(monkeypatch, ends_at=10.0)
    for actor in actors:
        assert 50 <= actor.ticks <= 60, actor.ticks


def test_an_instance_that_ends_at_once_is_collected_without_a_pause(monkeypatch):
    actors, collected = _watch(monkeypatch, ends_at=0.0, count=1)
    assert actors[0].ticks == 1 and collected == [0.0]


@pytest.mark.parametrize("ends_at", [0.05, 0.3, 7.0])
def test_the_exit_is_seen_within_one_interval(monkeypatch, ends_at):
    """The pause never holds back an ending by more than the longest interval."""
    _, collected = _watch(monkeypatch, ends_at=ends_at)
    assert len(collected) == 2
    assert all(ends_at <= t <= ends_at + 0.2 for t in collected), collected
