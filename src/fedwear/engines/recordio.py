"""Checkpoints and client states as NPZ archives: every array a ``.npy`` member, the rest JSON.

Run folders are shared (``results/runs/`` ships with the repository), so reading one must never
run code: nothing here unpickles. Files are read with ``np.load(allow_pickle=False)``; what is
not an array (the checkpoint's round, config hash, library versions, callback states, each
:class:`Record`'s scalars, the tree's dict key order) is one uint8 member ``meta.json``.

What is written comes back exactly, so a resumed run is bit-identical to an uninterrupted one:
dtypes, shapes and memory order of arrays (0-d arrays included), the Python type of every scalar
(JSON keeps ``str``, ``bool``, ``int``, finite ``float`` and ``None`` apart; the rest carries a
tag: numpy scalars with their dtype and bytes, non-finite floats with their bits, tuples) and key
order. Array members are named by their place in the tree, ``server/<array>`` and
``clients/<client>/<array>`` for a checkpoint (``%`` and ``/`` inside a name are written ``%25``
and ``%2F``), so ``np.load`` shows where each comes from; arrays of at most :data:`INLINE` bytes
are in ``meta.json`` instead (dtype, shape, memory order, base64 bytes). The bytes depend on the content only
(members dated 1980-01-01): the disk store names each state file by its digest.
"""

from __future__ import annotations

import base64
import io
import json
import math
import stat
import struct
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np

from fedwear.errors import FedwearError
from fedwear.methods.api import Record

#: The member holding everything that is not an array.
META = "meta.json"
#: Bumped when the layout changes; a file of another version is refused.
FORMAT = 1
_DATE = (1980, 1, 1, 0, 0, 0)
#: Arrays of at most this many bytes (biases, optimiser step counts, 0-d arrays) go into the JSON,
#: base64: a ``.npy`` member costs about 300 bytes of headers, more than most of them hold.
INLINE = 256
_INLINE_KINDS = "biufc"
#: numpy scalar kinds stored as dtype + bytes: bool, ints, floats, complex, datetimes, strings.
_SCALAR_KINDS = "biufcmMSU"
#: What a broken or foreign file raises while it is parsed.
_UNREADABLE = (OSError, ValueError, EOFError, LookupError, TypeError, zipfile.BadZipFile, zlib.error,
               NotImplementedError, RecursionError, struct.error)


def _member(name: str) -> str:
    """``name`` as one component of a member path: unambiguous, and never ``meta.json``."""
    escaped = name.replace("%", "%25").replace("/", "%2F")
    return "meta%2Ejson" if escaped == META else escaped


def _key(path: tuple[str, ...]) -> str:
    return "/".join(_member(p) for p in path)


def _encode(value: object, path: tuple[str, ...], arrays: dict[str, np.ndarray]) -> object:
    """JSON for ``value``; its arrays go to ``arrays`` under their member names."""
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {"$float": struct.pack(">d", value).hex()}
    if isinstance(value, np.generic):
        if value.dtype.kind not in _SCALAR_KINDS:
            raise TypeError(f"{_key(path)}: a numpy scalar of dtype {value.dtype} cannot be stored")
        return {"$np": value.dtype.str, "bytes": value.tobytes().hex()}
    if isinstance(value, np.ndarray):
        if value.nbytes <= INLINE and value.dtype.kind in _INLINE_KINDS and value.dtype.fields is None:
            order = "F" if value.flags.f_contiguous and not value.flags.c_contiguous else "C"
            data = base64.b64encode(value.tobytes(order=order)).decode()
            return {"$small": [value.dtype.str, list(value.shape), order, data]}
        key = _key(path)
        if key in arrays or key == META:
            raise ValueError(f"two arrays would be stored as {key!r}")
        arrays[key] = value
        return {"$array": None}
    if isinstance(value, Record):
        if bad := [n for n, a in value.arrays.items() if not isinstance(a, np.ndarray)]:
            raise TypeError(f"{_key((*path, bad[0]))}: a Record's arrays must be numpy arrays")
        return {"$record": {n: _encode(a, (*path, n), arrays) for n, a in value.arrays.items()},
                "scalars": _encode(dict(value.scalars), path, arrays)}
    if isinstance(value, tuple):
        return {"$tuple": [_encode(v, (*path, str(i)), arrays) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, (*path, str(i)), arrays) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if not all(type(k) is str for k in value):
            raise TypeError(f"{_key(path) or 'the root'}: only str dict keys can be stored")
        out = {k: _encode(v, (*path, k), arrays) for k, v in value.items()}
        return {"$dict": out} if any(k.startswith("$") for k in value) else out
    raise TypeError(f"{_key(path) or 'the root'}: a {type(value).__name__} cannot be stored")


def _decode(value: object, path: tuple[str, ...], arrays: dict[str, np.ndarray], used: set[str]) -> object:
    """The inverse of :func:`_encode`; ValueError (or another of ``_UNREADABLE``) when malformed."""
    if isinstance(value, list):
        return [_decode(v, (*path, str(i)), arrays, used) for i, v in enumerate(value)]
    if not isinstance(value, dict):
        return value
    tags = [k for k in value if k.startswith("$")]
    if not tags:
        return {k: _decode(v, (*path, k), arrays, used) for k, v in value.items()}
    tag = tags[0]
    if tag == "$dict" and len(value) == 1 and isinstance(value[tag], dict):
        return {k: _decode(v, (*path, k), arrays, used) for k, v in value[tag].items()}
    if tag == "$float" and len(value) == 1:
        (f,) = struct.unpack(">d", bytes.fromhex(value[tag]))
        return f
    if tag == "$np" and set(value) == {"$np", "bytes"}:
        dtype, data = np.dtype(value["$np"]), bytes.fromhex(value["bytes"])
        if dtype.kind not in _SCALAR_KINDS or len(data) != dtype.itemsize:
            raise ValueError(f"{_key(path)}: not a numpy scalar")
        return np.frombuffer(data, dtype=dtype)[0]
    if tag == "$array" and len(value) == 1:
        return _array(path, arrays, used)
    if tag == "$small" and len(value) == 1:
        return _small(path, *value[tag])
    if tag == "$record" and set(value) == {"$record", "scalars"} and isinstance(value[tag], dict):
        named = {n: _decode(v, (*path, n), arrays, used) for n, v in value[tag].items()}
        scalars = _decode(value["scalars"], path, arrays, used)
        if not isinstance(scalars, dict) or not all(isinstance(a, np.ndarray) for a in named.values()):
            raise ValueError(f"{_key(path)}: not a record")
        return Record(named, scalars)
    if tag == "$tuple" and len(value) == 1 and isinstance(value[tag], list):
        return tuple(_decode(v, (*path, str(i)), arrays, used) for i, v in enumerate(value[tag]))
    raise ValueError(f"{_key(path) or 'the root'}: unknown entry {tag!r}")


def _small(path: tuple[str, ...], dtype: str, shape: list, order: str, data: str) -> np.ndarray:
    """An array written into the JSON (see :data:`INLINE`), writeable and in its memory order."""
    kind = np.dtype(dtype)
    if kind.kind not in _INLINE_KINDS or kind.fields is not None or order not in ("C", "F") \
            or not all(type(n) is int and n >= 0 for n in shape):
        raise ValueError(f"{_key(path)}: not an array")
    flat = np.frombuffer(base64.b64decode(data, validate=True), dtype=kind)
    return flat.reshape(shape, order=order).copy(order=order)


def _array(path: tuple[str, ...], arrays: dict[str, np.ndarray], used: set[str]) -> np.ndarray:
    key = _key(path)
    if key in used:
        raise ValueError(f"array {key!r} named twice")
    used.add(key)
    return arrays[key]


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, allow_pickle=False)
    return buf.getvalue()


def _members(meta: dict, arrays: dict[str, np.ndarray]) -> Iterator[tuple[str, bytes]]:
    text = json.dumps(meta, allow_nan=False, separators=(",", ":"))
    yield META, _npy(np.frombuffer(text.encode(), np.uint8))
    for key, a in arrays.items():
        yield key, _npy(a)


def write(f: IO[bytes], obj: object) -> None:
    """Write ``obj`` (dicts with str keys, lists, tuples, Records, arrays, scalars) to ``f``
    as an NPZ archive; TypeError for what cannot come back exactly (object arrays, other types)."""
    arrays: dict[str, np.ndarray] = {}
    meta = {"format": FORMAT, "value": _encode(obj, (), arrays)}
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for key, data in _members(meta, arrays):
            info = zipfile.ZipInfo(key + ".npy", date_time=_DATE)
            info.external_attr = 0o600 << 16
            zf.writestr(info, data)


def dumps(obj: object) -> bytes:
    """:func:`write` into bytes."""
    buf = io.BytesIO()
    write(buf, obj)
    return buf.getvalue()


def read(path: Path, what: str) -> object:
    """What :func:`write` wrote to ``path``, without unpickling anything. A file that is not
    such an archive (a pickle, an object array, a broken or foreign file) raises one-line
    FedwearError naming ``path`` as an unreadable ``what``."""
    try:
        return _read(path)
    except FedwearError:
        raise
    except _UNREADABLE as e:
        reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise FedwearError(f"{path}: not a readable {what} ({reason}); rerun with --overwrite") from None


def _fits(member: IO[bytes], info: zipfile.ZipInfo) -> None:
    """A ValueError unless the ``.npy`` header of ``member`` declares an array that its stored
    bytes can hold: numpy allocates the declared size before reading (a shape of 10**12 in a
    few bytes would take terabytes)."""
    version = np.lib.format.read_magic(member)
    if version not in ((1, 0), (2, 0)):
        raise ValueError(f"member {info.filename!r} is .npy version {version}: fedwear writes 1.0 or 2.0")
    header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = header(member)
    declared = math.prod(shape) * dtype.itemsize
    if declared > info.file_size:
        raise ValueError(f"member {info.filename!r} declares {declared} bytes of data in a {info.file_size}-byte member")


def _read(path: Path) -> object:
    if not stat.S_ISREG(path.stat().st_mode):  # a FIFO would block the read forever
        raise ValueError("not a regular file")
    with path.open("rb") as f:
        head = f.read(4)
    if head != b"PK\x03\x04":
        raise ValueError("not an NPZ archive" + (": it holds pickled data, which fedwear never loads"
                                                 if head[:1] == b"\x80" else ""))
    with zipfile.ZipFile(path) as zf:  # fedwear stores its members: memory stays bounded by the file
        for info in zf.infolist():
            if info.compress_type != zipfile.ZIP_STORED or info.file_size > info.compress_size:
                raise ValueError(f"member {info.filename!r} is compressed ({info.file_size} bytes from "
                                 f"{info.compress_size}): fedwear writes its archives stored and never inflates one")
            with zf.open(info) as member:
                _fits(member, info)
    loaded = np.load(path, allow_pickle=False)
    with loaded:
        if any(not n.endswith(".npy") for n in loaded.zip.namelist()):
            raise ValueError("a member is not a .npy array")
        arrays = {k: loaded[k] for k in loaded.files}
    raw = arrays.pop(META, None)
    if raw is None or raw.dtype != np.uint8 or raw.ndim != 1:
        raise ValueError(f"no {META}")
    meta = json.loads(raw.tobytes().decode())
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or set(meta) != {"format", "value"}:
        raise ValueError(f"not format {FORMAT} of fedwear's files")
    used: set[str] = set()
    value = _decode(meta["value"], (), arrays, used)
    if extra := sorted(set(arrays) - used):
        raise ValueError(f"array {extra[0]!r} belongs to nothing")
    return value
