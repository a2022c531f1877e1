"""A pickle read as plain data, within bounds fixed in advance. Pure.

The standard unpickler cannot be bounded: a 9-byte pickle (``LONG_BINPUT`` with a huge index) makes it
allocate gigabytes for its memo, and nothing limits how many objects it builds, how deep they nest or how
large an integer it decodes. :func:`read_pickle` is a small interpreter of its own for the opcodes that
carry plain values (protocols 2 to 5: ``dict``, ``list``, ``tuple``, ``str``, ``bytes``, ``int``, ``float``,
``bool``, ``None``, the memo, marks, frames), and nothing else:

- no opcode that names a global or builds an object is run (``GLOBAL``, ``STACK_GLOBAL``, ``REDUCE``,
  ``BUILD``, ``INST``, ``OBJ``, ``NEWOBJ``, ``NEWOBJ_EX``, ``EXT1/2/4``, ``PERSID``, ``BINPERSID``,
  out-of-band buffers): refused (``code``);
- every size is checked before anything is built: a string or bytes at most :attr:`Limits.max_string` long,
  an integer at most :attr:`Limits.max_int_bytes` bytes, memo indexes in order (a gap of at most
  :attr:`Limits.max_memo_gap`), marks nested at most :attr:`Limits.max_marks` deep; each opcode is charged
  the memory of what it builds or stores (an over-estimate of CPython's 64-bit sizes: a stack, list or memo
  slot 8 bytes, a dict 200 and 40 a key, a str 64 and 4 a byte of UTF-8, ...) and at most
  :attr:`Limits.max_memory` is built, by at most :attr:`Limits.max_ops` opcodes: refused (``limits``);
- dict keys are strings, bytes, bools, None or 64-bit integers (no key whose hash or comparison could cost
  more than its size, no crafted hash collisions);
- what was built is then checked as a whole, without expanding shared parts: no container inside itself,
  containers nested at most :attr:`Limits.max_depth` deep.

Memory is therefore bounded by the limits (and the input), time by the input's length.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

__all__ = ["LIMITS", "Limits", "PickleError", "check_shape", "read_pickle"]


class PickleError(ValueError):
    """Why a pickle was not read; ``reason`` is ``malformed``, ``code`` (it would build objects or name
    globals) or ``limits`` (a bound of :class:`Limits`)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Limits:
    max_ops: int = 16_000_000  # opcodes run (time); a 20,000-entry dump with 50-frame stacks runs ~3.1M
    max_memory: int = 256 << 20  # bytes of what is built, as estimated below; that dump: ~60 MiB
    max_string: int = 1 << 20  # bytes in one str or bytes value
    max_int_bytes: int = 16  # bytes of one LONG1/LONG4 integer (128 bits)
    max_marks: int = 64  # marks open at once
    max_memo_gap: int = 16  # how far past the memo's end a PUT may store (picklers leave no gap)
    max_depth: int = 32  # containers nested in one another, the outermost included


LIMITS = Limits()

_HOLE = object()  # a memo slot skipped by a PUT past the end
_KEY_TYPES = (str, bytes, bool, type(None))
_I4 = struct.Struct("<i").unpack_from
_U2 = struct.Struct("<H").unpack_from
_U4 = struct.Struct("<I").unpack_from
_U8 = struct.Struct("<Q").unpack_from
_F8 = struct.Struct(">d").unpack_from

#: opcodes that would run code or make objects of a class: never run
_CODE = {
    0x63: "GLOBAL",
    0x93: "STACK_GLOBAL",
    0x52: "REDUCE",
    0x62: "BUILD",
    0x69: "INST",
    0x6F: "OBJ",
    0x81: "NEWOBJ",
    0x92: "NEWOBJ_EX",
    0x82: "EXT1",
    0x83: "EXT2",
    0x84: "EXT4",
    0x50: "PERSID",
    0x51: "BINPERSID",
    0x97: "NEXT_BUFFER",
    0x98: "READONLY_BUFFER",
}


def _malformed(message: str) -> PickleError:
    return PickleError("malformed", f"not a readable pickle: {message}")


def _limit(message: str) -> PickleError:
    return PickleError("limits", f"refused: {message}")


def _refuse_code(op: int, data: bytes, pos: int, stack: list[Any]) -> PickleError:
    name = _CODE[op]
    if op in (0x63, 0x69):  # GLOBAL / INST: "module\nname\n" follows
        parts = data[pos : pos + 512].split(b"\n", 2)
        if len(parts) == 3:
            module, attr = (p.decode("utf-8", "replace") for p in parts[:2])
            return PickleError("code", f"refused: the dump references {module[:64]}.{attr[:64]} ({name})")
    if op == 0x93 and len(stack) >= 2 and isinstance(stack[-2], str) and isinstance(stack[-1], str):
        return PickleError("code", f"refused: the dump references {stack[-2][:64]}.{stack[-1][:64]} ({name})")
    if op in (0x50, 0x51):
        return PickleError("code", f"refused: persistent ids ({name})")
    return PickleError("code", f"refused: {name} builds objects (only basic types are read)")


def _key_ok(key: object) -> bool:
    if isinstance(key, _KEY_TYPES):
        return True
    return type(key) is int and -(1 << 63) <= key < (1 << 64)


def read_pickle(data: bytes, limits: Limits = LIMITS) -> Any:
    """The value ``data`` pickles, made of basic types only; :class:`PickleError` when it is not a pickle
    of protocol 2 to 5, would need more than basic types, or exceeds ``limits``."""
    n = len(data)
    if n < 2 or data[0] != 0x80:
        raise _malformed("no protocol header")
    if not 2 <= data[1] <= 5:
        raise _malformed(f"protocol {data[1]} (2 to 5 are read)")
    max_ops, max_memory, max_string = limits.max_ops, limits.max_memory, limits.max_string
    max_int, max_marks, max_gap = limits.max_int_bytes, limits.max_marks, limits.max_memo_gap
    stack: list[Any] = []
    marks: list[int] = []
    memo: list[Any] = []
    floor = 0  # the stack's length at the innermost open mark: nothing below it is popped
    ops = memory = 0
    pos = 2
    while True:
        ops += 1
        if ops > max_ops or memory > max_memory:
            what = f"{max_ops} opcodes" if ops > max_ops else f"{max_memory / (1 << 20):g} MiB of values"
            raise _limit(f"more than {what}")
        if pos >= n:
            raise _malformed("truncated (no STOP)")
        op = data[pos]
        pos += 1
        try:
            if op == 0x68 or op == 0x6A:  # BINGET h, LONG_BINGET j
                if op == 0x68:
                    index = data[pos]
                    pos += 1
                else:
                    (index,) = _U4(data, pos)
                    pos += 4
                if index >= len(memo) or (value := memo[index]) is _HOLE:
                    raise _malformed(f"memo index {index} read before it was stored")
                stack.append(value)
                memory += 8
            elif op == 0x71 or op == 0x72 or op == 0x94:  # BINPUT q, LONG_BINPUT r, MEMOIZE
                if len(stack) <= floor:
                    raise _malformed("memo store with nothing on the stack")
                if op == 0x71:
                    index = data[pos]
                    pos += 1
                elif op == 0x72:
                    (index,) = _U4(data, pos)
                    pos += 4
                else:
                    index = len(memo)
                end = len(memo)
                if index < end:
                    memo[index] = stack[-1]
                elif index - end <= max_gap:
                    if index > end:
                        memo.extend([_HOLE] * (index - end))
                    memo.append(stack[-1])
                    memory += 8 * (index - end + 1)
                else:
                    raise _limit(f"memo index {index} out of order (the memo holds {end})")
            elif op == 0x58 or op == 0x8C or op == 0x8D or op == 0x42 or op == 0x43 or op == 0x8E:
                # BINUNICODE X, SHORT_BINUNICODE, BINUNICODE8, BINBYTES B, SHORT_BINBYTES C, BINBYTES8
                if op == 0x58 or op == 0x42:
                    (size,) = _U4(data, pos)
                    pos += 4
                elif op == 0x8C or op == 0x43:
                    size = data[pos]
                    pos += 1
                else:
                    (size,) = _U8(data, pos)
                    pos += 8
                if size > max_string:
                    raise _limit(f"a string of {size} bytes (at most {max_string})")
                if pos + size > n:
                    raise _malformed("truncated string")
                raw = data[pos : pos + size]
                pos += size
                if op == 0x58 or op == 0x8C or op == 0x8D:
                    stack.append(raw.decode("utf-8", "surrogatepass"))
                    memory += 72 + 4 * size  # up to 4 bytes a character
                else:
                    stack.append(raw)
                    memory += 72 + size
            elif op == 0x28:  # MARK (
                if len(marks) >= max_marks:
                    raise _limit(f"marks nested more than {max_marks} deep")
                floor = len(stack)
                marks.append(floor)
                memory += 8
            elif op == 0x4B:  # BININT1 K
                stack.append(data[pos])
                pos += 1
                memory += 8
            elif op == 0x5D or op == 0x7D or op == 0x29:  # EMPTY_LIST ], EMPTY_DICT }, EMPTY_TUPLE )
                stack.append([] if op == 0x5D else {} if op == 0x7D else ())
                memory += 64 if op == 0x5D else 208 if op == 0x7D else 8
            elif op == 0x65 or op == 0x75 or op == 0x6C or op == 0x64 or op == 0x74:
                # APPENDS e, SETITEMS u, LIST l, DICT d, TUPLE t: the items since the last mark
                if not marks:
                    raise _malformed("no mark to take items from")
                start = marks.pop()
                floor = marks[-1] if marks else 0
                items = stack[start:]
                del stack[start:]
                if op == 0x74:
                    stack.append(tuple(items))
                    memory += 56
                elif op == 0x6C:
                    stack.append(items)
                    memory += 64
                elif op == 0x64:
                    stack.append(_pairs({}, items))
                    memory += 208 + 20 * len(items)
                else:
                    if len(stack) <= floor:
                        raise _malformed("nothing to add the items to")
                    target = stack[-1]
                    if op == 0x65:
                        if type(target) is not list:
                            raise _malformed(f"APPENDS to a {type(target).__name__}")
                        target.extend(items)
                    else:
                        if type(target) is not dict:
                            raise _malformed(f"SETITEMS on a {type(target).__name__}")
                        _pairs(target, items)
                        memory += 20 * len(items)
            elif op == 0x4E or op == 0x88 or op == 0x89:  # NONE N, NEWTRUE, NEWFALSE
                stack.append(None if op == 0x4E else op == 0x88)
                memory += 8
            elif op == 0x4A or op == 0x4D:  # BININT J, BININT2 M
                if op == 0x4A:
                    (number,) = _I4(data, pos)
                    pos += 4
                else:
                    (number,) = _U2(data, pos)
                    pos += 2
                stack.append(number)
                memory += 40
            elif op == 0x8A or op == 0x8B:  # LONG1, LONG4
                if op == 0x8A:
                    size = data[pos]
                    pos += 1
                else:
                    (size,) = _I4(data, pos)
                    pos += 4
                    if size < 0:
                        raise _malformed("negative LONG4 size")
                if size > max_int:
                    raise _limit(f"an integer of {size} bytes (at most {max_int})")
                if pos + size > n:
                    raise _malformed("truncated integer")
                stack.append(int.from_bytes(data[pos : pos + size], "little", signed=True))
                pos += size
                memory += 40 + size
            elif op == 0x85 or op == 0x86 or op == 0x87:  # TUPLE1, TUPLE2, TUPLE3
                size = op - 0x84
                if len(stack) - floor < size:
                    raise _malformed("a tuple of more items than the stack holds")
                items = stack[-size:]
                del stack[-size:]
                stack.append(tuple(items))
                memory += 56
            elif op == 0x61:  # APPEND a
                if len(stack) - floor < 2:
                    raise _malformed("APPEND with too little on the stack")
                item = stack.pop()
                if type(stack[-1]) is not list:
                    raise _malformed(f"APPEND to a {type(stack[-1]).__name__}")
                stack[-1].append(item)
            elif op == 0x73:  # SETITEM s
                if len(stack) - floor < 3:
                    raise _malformed("SETITEM with too little on the stack")
                item = stack.pop()
                key = stack.pop()
                if type(stack[-1]) is not dict:
                    raise _malformed(f"SETITEM on a {type(stack[-1]).__name__}")
                _pairs(stack[-1], [key, item])
                memory += 40
            elif op == 0x47:  # BINFLOAT G
                (real,) = _F8(data, pos)
                pos += 8
                stack.append(real)
                memory += 32
            elif op == 0x32:  # DUP 2
                if len(stack) <= floor:
                    raise _malformed("DUP of nothing")
                stack.append(stack[-1])
                memory += 8
            elif op == 0x30:  # POP 0: the top item, or an empty mark
                if len(stack) > floor:
                    stack.pop()
                elif marks:
                    marks.pop()
                    floor = marks[-1] if marks else 0
                else:
                    raise _malformed("POP of nothing")
            elif op == 0x31:  # POP_MARK 1
                if not marks:
                    raise _malformed("POP_MARK with no mark")
                del stack[marks.pop() :]
                floor = marks[-1] if marks else 0
            elif op == 0x95:  # FRAME: a length the reader has no use for
                (size,) = _U8(data, pos)
                pos += 8
                if pos + size > n:
                    raise _malformed("truncated frame")
            elif op == 0x80:  # PROTO again
                if not 2 <= data[pos] <= 5:
                    raise _malformed(f"protocol {data[pos]} (2 to 5 are read)")
                pos += 1
            elif op == 0x2E:  # STOP .
                if len(stack) <= floor or marks:
                    raise _malformed("STOP without a single value")
                result = stack[-1]
                check_shape(result, limits.max_depth)
                return result
            elif op in _CODE:
                raise _refuse_code(op, data, pos, stack)
            else:
                raise _malformed(f"opcode 0x{op:02x} is not read (not used by plain data at protocol 2+)")
        except (IndexError, struct.error):
            raise _malformed("truncated") from None
        except UnicodeDecodeError:
            raise _malformed("a string that is not UTF-8") from None


def _pairs(target: dict[Any, Any], items: list[Any]) -> dict[Any, Any]:
    if len(items) % 2:
        raise _malformed("an odd number of items for a dict")
    for i in range(0, len(items), 2):
        key = items[i]
        if not _key_ok(key):
            raise _malformed(f"a dict key of type {type(key).__name__} (keys are strings or numbers)")
        target[key] = items[i + 1]
    return target


def check_shape(root: object, max_depth: int) -> None:
    """:class:`PickleError` (``limits``) when a container in ``root`` contains itself or containers nest
    more than ``max_depth`` deep. Each container is looked into once, however often it is shared: the time
    is that of the object graph, never of the tree it would expand to."""
    if not isinstance(root, list | dict | tuple):
        return
    heights: dict[int, int] = {id(root): 0}  # id -> containers below and including it; 0 while on the path
    # the path from the root: [container, its children not yet looked at, the highest child so far]
    path: list[list[Any]] = [[root, iter(root.values() if isinstance(root, dict) else root), 0]]
    while path:
        frame = path[-1]
        for child in frame[1]:
            if not isinstance(child, list | dict | tuple):
                continue
            height = heights.get(id(child))
            if height is None:
                if len(path) >= max_depth:
                    raise _limit(f"containers nested more than {max_depth} deep")
                heights[id(child)] = 0
                path.append([child, iter(child.values() if isinstance(child, dict) else child), 0])
                break
            if height == 0:
                raise _limit("a container that contains itself")
            if len(path) + height > max_depth:
                raise _limit(f"containers nested more than {max_depth} deep")
            frame[2] = max(frame[2], height)
        else:
            path.pop()
            height = frame[2] + 1
            heights[id(frame[0])] = height
            if path:
                path[-1][2] = max(path[-1][2], height)
