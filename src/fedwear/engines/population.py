"""Several runs trained as one population: the clients of every run of a comparison that shares a
model and a step train together, (run, client) by (run, client), in one vectorised computation
(``fedwear compare --together``, ``engine: batched``).

Each run goes through its own round loop, in a thread of its own, writing its own folder; one
baton lets a single run execute at a time, so everything but training happens as it would alone
(the global torch generator, the log, the CSV files). A run whose round reaches a stage of
training together (``FedAvg.fit_many``) hands its clients to the population and gives the baton
up; when every run still going is waiting, the last one to arrive trains all the waiting clients
whose runs share a model, step and settings together (:meth:`FedAvg.train_together`), and each
run takes its own back. A run that does not train together (another method, a model too large)
simply runs on; the others wait for it. Every run's numbers are those of the same run alone up
to float rounding (``tests/test_population.py``).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fedwear.methods.together import POPULATION


@dataclass
class _Request:
    method: Any
    stage: Any
    fits: list
    starts: list
    result: list | None = None
    error: BaseException | None = None


@dataclass
class Population:
    """The baton and the waiting room of a group of runs (see the module docstring)."""

    live: int
    baton: threading.Condition = field(default_factory=threading.Condition)
    waiting: list[_Request] = field(default_factory=list)

    def run(self, work: Callable[[], Any]) -> Any:
        """``work()`` (one run) as a member: with the baton, training through the population."""
        with self.baton:
            token = POPULATION.set(self.train)
            try:
                return work()
            finally:
                POPULATION.reset(token)
                self.live -= 1
                self._train_if_all_wait()

    def train(self, method, stage, fits, starts) -> list:
        """Called by a run holding the baton: its clients' ``stage``, trained with the other runs'."""
        request = _Request(method, stage, fits, starts)
        self.waiting.append(request)
        self._train_if_all_wait()
        while request.result is None and request.error is None:
            self.baton.wait()
        if request.error is not None:
            raise request.error
        return request.result

    def _train_if_all_wait(self) -> None:
        if not self.waiting or len(self.waiting) < self.live:
            return
        waiting, self.waiting = self.waiting, []
        groups: dict[tuple, list[_Request]] = {}
        for r in waiting:
            groups.setdefault(_key(r), []).append(r)
        for group in groups.values():
            try:
                first = group[0]
                trained = first.method.train_together(first.stage, [f for r in group for f in r.fits],
                                                      [s for r in group for s in r.starts])
                for r in group:
                    r.result, trained = trained[:len(r.fits)], trained[len(r.fits):]
            except BaseException as e:  # every run of the group fails with it, none waits forever
                for r in group:
                    r.error = e
        self.baton.notify_all()


def _key(r: _Request) -> tuple:
    """What clients trained together must share: the method and its options, the run's training
    settings but its seed and rounds, the data's shape and target scaling, the stage but its loss
    (the same method's, with the same options)."""
    task = r.method.task
    training = dataclasses.replace(task.training, seed=0, rounds=0)
    stage = dataclasses.replace(r.stage, loss=None)
    return (type(r.method), repr(r.method.options), repr(training), task.window, task.channels, task.num_outputs,
            task.kind, task.target, repr(stage))


__all__ = ["Population"]
