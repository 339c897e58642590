"""Plain containers passed between the data layer and the rest of fedwear."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

UNLABELLED = -1


@dataclass
class Recording:
    """One continuous recording as the dataset ships it.

    ``signal`` is float32 ``[T, C]``; ``labels`` is int64 ``[T]`` with class indices
    (0-based, into the dataset's ``class_names``) or ``UNLABELLED`` (-1).

    ``meta`` holds what else identifies where the recording comes from, as strings keyed by
    name: e.g. ``device`` (HHAR's phone model), ``position`` (RealWorld's body position),
    ``source`` (the dataset, when datasets are combined). A loader sets only the
    keys it knows (empty by default); ``subject`` and ``session`` are fields, never meta keys
    (:data:`RESERVED_KEYS`). Partitions and normalisation groups are keyed by these names
    (``dataset.client_by``, ``dataset.normalize_group``; :func:`key_value`).
    """

    subject: str
    session: str
    signal: np.ndarray
    labels: np.ndarray
    channels: list[str]
    rate_hz: float
    meta: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clash = [k for k in RESERVED_KEYS if k in self.meta]
        if clash:
            raise ValueError(f"Recording.meta may not hold {clash}: they are Recording fields")


#: The recording keys that are fields of :class:`Recording` rather than ``meta`` entries.
RESERVED_KEYS = ("subject", "session")


def key_value(rec: Recording, key: str) -> str | None:
    """The value of ``key`` for ``rec``: its subject or session, else ``rec.meta[key]``; None
    when the recording does not carry that key."""
    return getattr(rec, key) if key in RESERVED_KEYS else rec.meta.get(key)


def recording_keys(recordings: list[Recording]) -> list[str]:
    """The keys ``recordings`` can be grouped by: ``subject``, ``session``, then every meta key
    carried by at least one of them, sorted."""
    return [*RESERVED_KEYS, *sorted({k for r in recordings for k in r.meta} - set(RESERVED_KEYS))]


@dataclass
class RawDataset:
    name: str
    recordings: list[Recording]
    class_names: list[str]


@dataclass
class Windows:
    """Windows cut from recordings. ``x`` is float32 ``[N, T, C]``; ``y`` is ``[N]``: int64 class
    indices (classification) or float32 targets (regression, in the scaled units the model sees).

    ``recording`` (index into the source recording list) and ``start`` (first sample,
    at the processed rate) let splits prove that train and test never overlap.
    """

    x: np.ndarray
    y: np.ndarray
    recording: np.ndarray
    start: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    def take(self, idx: np.ndarray) -> Windows:
        return Windows(self.x[idx], self.y[idx], self.recording[idx], self.start[idx])

    @staticmethod
    def empty(window: int, channels: int, y_dtype: type = np.int64) -> Windows:
        return Windows(
            np.zeros((0, window, channels), np.float32),
            np.zeros(0, y_dtype),
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
        )


@dataclass
class ClientData:
    """One client's splits. ``val`` may be empty."""

    client_id: str
    train: Windows
    test: Windows
    val: Windows


@dataclass
class FederatedData:
    """What a run trains and evaluates on.

    ``clients`` train; ``new_clients`` never train and are used for the new-client view.
    ``kind`` is the task: ``classification`` (``y`` indexes ``class_names``) or ``regression``
    (``y`` is a float target, ``class_names`` is empty, the model has one output). ``target`` is
    ``(shift, scale)``: a regression target in its own units (bpm) is ``y * scale + shift``.
    """

    name: str
    clients: list[ClientData]
    new_clients: list[ClientData]
    class_names: list[str]
    channels: list[str]
    rate_hz: float
    window: int
    info: dict[str, object] = field(default_factory=dict)
    kind: str = "classification"
    target: tuple[float, float] = (0.0, 1.0)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def num_outputs(self) -> int:
        """Model outputs: one per class, or one for a regression target."""
        return 1 if self.kind == "regression" else self.num_classes
