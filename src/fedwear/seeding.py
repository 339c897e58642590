"""Every random draw comes from (run seed, purpose, round, client): engine- and order-independent."""

from __future__ import annotations

import zlib

import numpy as np

PURPOSES = {"schedule": 1, "fit": 2, "adapt": 3, "personalize": 4, "select": 5, "dp": 6}

#: The largest seed (run or dataset) every generator fedwear seeds accepts: numpy's SeedSequence
#: takes no negative entropy, and ``torch.manual_seed`` (handed the run seed by the methods)
#: overflows at 2**64. Seeds are 0 .. SEED_MAX.
SEED_MAX = 2**64 - 1


def derive_seed(seed: int, purpose: str, round: int = 0, client: str = "") -> int:
    """A 63-bit seed for one (purpose, round, client) draw; a purpose outside ``PURPOSES`` (a
    method's own, e.g. ``"body"``) is identified by the CRC-32 of its name."""
    code = PURPOSES.get(purpose, zlib.crc32(purpose.encode()) | 1 << 32)
    ss = np.random.SeedSequence([seed, code, round, zlib.crc32(client.encode())])
    return int(ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def client_schedule(seed: int, clients: list[str], rounds: int, per_round: int) -> list[list[str]]:
    """Clients of every round, drawn up front uniformly without replacement (ProtoHAR's code, cheng-haha/ProtoHAR serverProtoHAR.py)."""
    rng = np.random.default_rng(derive_seed(seed, "schedule"))
    ids = sorted(clients)
    return [sorted(rng.choice(ids, per_round, replace=False).tolist()) for _ in range(rounds)]
