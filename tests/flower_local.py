"""An in-process Flower Grid for fast tests of the Flower engine's server side (no Ray).

Each message is serialised-like (deep-copied) and handed to the ClientApp of its node at push
time; ``dead`` nodes never answer, ``tamper`` rewrites a node's replies. ``array_names`` holds
the name of every array that travelled, either way.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity


class LocalGrid(Grid):
    def __init__(self, client_app, num_nodes: int, tamper: dict[int, Callable] | None = None,
                 dead: set[int] | None = None) -> None:
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        self.app = client_app
        self.contexts = {
            100 + i: Context(run_id=1, node_id=100 + i, node_config={"partition-id": i, "num-partitions": num_nodes},
                             state=RecordDict(), run_config={})
            for i in range(num_nodes)
        }
        self.tamper = tamper or {}
        self.dead = dead or set()
        self.replies: dict[str, Message] = {}
        self.array_names: set[str] = set()
        self._run = Run.create_empty(run_id=1)

    @property
    def run(self):
        return self._run

    def set_run(self, run) -> None:
        self._run = run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)

    def get_node_ids(self):
        return list(self.contexts)

    def get_nodes(self):
        return []

    def push_messages(self, messages):
        ids = []
        for m in messages:
            mid = uuid.uuid4().hex
            m.metadata.__dict__["_message_id"] = mid
            ids.append(mid)
            node = m.metadata.dst_node_id
            if node in self.dead and m.metadata.message_type != "query":  # dies after joining
                continue
            reply = self.app(copy.deepcopy(m), self.contexts[node])
            if node in self.tamper and m.metadata.message_type.startswith("train."):
                reply = self.tamper[node](reply)
            reply.metadata.__dict__["_reply_to_message_id"] = mid
            self.replies[mid] = reply
            for sent in (m, reply):
                if sent.has_content():
                    for record in sent.content.array_records.values():
                        self.array_names.update(record.keys())
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]

    def send_and_receive(self, messages, *, timeout=None):
        return self.pull_messages(self.push_messages(list(messages)))
