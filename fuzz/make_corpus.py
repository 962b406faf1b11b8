"""Write the seed corpora in ``fuzz/corpus/TARGET/`` from the real encoders, plus hand-made edge cases.

    python -m fuzz.make_corpus        # rewrites every seed file (deterministic: same bytes each time)

Seeds are small (well under 2 MB in all): valid messages of every kind, then a few edge cases
(truncated, empty, wrong magic, a payload longer than the limit claims) that reach the checks.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Final

import numpy as np
import torch

from fuzz.targets import DEMO_LIMITS, FUZZ_LIMITS
from squall.cluster.swarm.wire import NodeCommand
from squall.protocols.al_dsgd.exchange import make_header, pack
from squall.protocols.demo.wire import SCHEMA as DEMO_SCHEMA
from squall.protocols.demo.wire import payload_of
from squall.protocols.dropcompute.abort import encode_notice
from squall.protocols.moshpit import messages as moshpit
from squall.protocols.moshpit.membership import Heartbeat
from squall.protocols.swarm.frames import Frame, FrameKind, frame_bytes, to_message
from squall.training.compress import (
    SCHEMAS,
    DenseFloat16,
    DenseFloat32,
    Fp4E3M0,
    GroupQuant,
    LatticeCompressor,
    RandK,
    TopK,
)
from squall.training.compress.fp4 import SCHEMA as FP4_SCHEMA
from squall.training.compress.lattice import Encoded, encode
from squall.wire import Message, MsgType, chunk_messages, encode_datagram, encode_message, pack_compressed
from squall.worker.commands import AgentCommand
from squall.worker.jsonline import encode_line

CORPUS: Final = Path(__file__).resolve().parent / "corpus"
PROFILES: Final = Path(__file__).resolve().parents[1] / "netem_profiles"


def _frame(message: Message, *, sender: int = 1, crc: bool = False) -> bytes:
    return encode_message(message, sender=sender, limits=FUZZ_LIMITS, crc=crc).tobytes()


def wire_seeds() -> list[bytes]:
    """Whole frames of each message type."""
    tensors = [torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.tensor(3.5), torch.zeros(0),
               torch.arange(4, dtype=torch.int64), torch.ones(3, dtype=torch.float16)]
    seeds = [_frame(Message.of_tensor(t, round=2, tag=7)) for t in tensors]
    seeds += [_frame(chunk, crc=True) for chunk in chunk_messages(torch.arange(40.0), max_frame_bytes=160)[:2]]
    seeds.append(_frame(Message.of_control({"op": 1, "list": [1, 2.5, None, True], "s": "x"}, round=1)))
    seeds += [_frame(Message.empty(kind)) for kind in (MsgType.HEARTBEAT, MsgType.BYE)]
    return seeds


def framing_seeds() -> list[bytes]:
    """A cut size byte, then several frames back to back."""
    stream = b"".join(wire_seeds()[:4])
    return [bytes([cut]) + stream for cut in (0, 7, 47, 255)] + [b"\x05" + wire_seeds()[0][:30]]


def udp_seeds() -> list[bytes]:
    """Datagrams with CRCs, chunks among them."""
    seeds = [encode_datagram(Message.of_tensor(torch.arange(5.0)), sender=2, limits=FUZZ_LIMITS)]
    chunks = chunk_messages(torch.arange(64.0).reshape(8, 8), max_frame_bytes=200)
    seeds += [encode_datagram(c, sender=1, limits=FUZZ_LIMITS) for c in chunks[:3]]
    seeds.append(encode_datagram(Message.of_control({"op": 2}), sender=0, limits=FUZZ_LIMITS))
    return seeds


def _encoded_vector() -> Encoded:
    """A lattice-encoded vector."""
    return encode(np.linspace(-1.0, 1.0, 9), 0.05, 8)


def swarm_seeds() -> list[bytes]:
    """Frames of every kind, raw and inside a wire message ('W' + frame)."""
    vectors: list[object] = [np.linspace(0.0, 1.0, 5, dtype=np.float32)]
    vectors.append(_encoded_vector())
    frames = [Frame(FrameKind.OFFER, 3, v) for v in vectors]  # type: ignore[arg-type]
    frames += [Frame(FrameKind.ANSWER, 3, vectors[-1])]  # type: ignore[arg-type]
    frames += [Frame(kind, 0) for kind in FrameKind if kind not in (FrameKind.OFFER, FrameKind.ANSWER)]
    seeds = [frame_bytes(f) for f in frames]
    seeds += [b"W" + _frame(to_message(f)) for f in frames[:2]]
    return seeds


def moshpit_seeds() -> list[bytes]:
    """Whole frames of each Moshpit control message."""
    info = moshpit.GroupInfo(5, 2, (0, 1, 3), (1.0, 1.0, 2.0), (0.25, 0.25, 0.5), 1)
    messages = [
        moshpit.heartbeat(Heartbeat(1, 2, 4, False, 10, 0.5), 4),
        moshpit.join([0, 1], 1.0, 1e6, 4),
        moshpit.group(info),
        moshpit.reject(4, "closed"),
        moshpit.control(moshpit.Op.LEAVE, 4),
        moshpit.excluded(info, as_owner=True),
    ]
    return [_frame(m, sender=1) for m in messages]


def compressed_seeds() -> list[bytes]:
    """A first byte (picks the decoder's reference), then a packed payload of every compressor."""
    x = np.linspace(-1.0, 1.0, 9)
    payloads = [LatticeCompressor(bits=bits, eps=0.05).encode(x) for bits in (4, 8)]
    payloads += [DenseFloat32().encode(x.astype(np.float32)), DenseFloat32().encode(np.zeros(0, np.float32))]
    payloads += [DenseFloat16().encode(x), TopK(k=3).encode(x), RandK(k=3, seed=5).encode(x)]
    payloads += [GroupQuant(bits=bits, group=4).encode(x) for bits in (4, 8)]
    return [bytes([k]) + pack_compressed(p, SCHEMAS[p.compressor], limits=FUZZ_LIMITS)
            for k, p in enumerate(payloads)]


def profile_seeds() -> list[bytes]:
    """The shipped profiles, and a few hostile YAML shapes."""
    seeds = [path.read_bytes() for path in sorted(PROFILES.glob("*.yaml"))]
    seeds += [
        b"name: a\nname: b\ndescription: d\n",
        b"name: !!python/object/apply:os.system ['true']\ndescription: d\n",
        b"a: &a [x, x]\nb: &b [*a, *a]\nname: *b\n",
        b"name: &n [*n]\n",
        b"name: t\ndescription: d\nlinks: {<<: {default: {delay: 1ms}}, default: {delay: 2ms}}\n",
    ]
    return seeds


def trace_seeds() -> list[bytes]:
    """The shipped link traces (as CSV, and the first as JSON), an availability table, hostile rows."""
    traces = sorted((PROFILES / "traces").glob("*.csv"))
    seeds = [b"\x00" + b"\n".join(path.read_bytes().splitlines()[:40]) for path in traces]
    seeds += [
        b"\x01" + b'[["time", "delay", "rate"], ["0s", "10ms", "1mbit"], ["1s", "5ms", "2mbit"]]',
        b"\x01" + b'[{"time": "0s", "loss": "1%"}, {"time": "0.1s", "loss": {"percent": "2%"}}]',
        b"\x02node,down,up\n1,2s,5s\n2,3s,\n",
        b"\x03" + b'[{"node": 0, "down": "1s", "up": "2s"}]',
        b"\x04time,jitter\n0s,1ms\n# comment\n\n59min,2ms\n",
        b'\x00time,delay\n0s,"1ms\n',
        b"\x01" + b"[" * 2000 + b"]" * 2000,
    ]
    return seeds


def straggler_seeds() -> list[bytes]:
    """DropCompute's abort notices and AL-DSGD's parameters with their header, as whole frames."""
    notices = [encode_notice(12, "peer 5 lost", {5: "connection closed without BYE"}, round=12),
               encode_notice(0, "timeout", {}, round=0),
               encode_notice(3, "x" * 600, {1: "a", 2: "b"}, round=3)]
    header = make_header(0.25, 2, 0)
    tensors = [pack(torch.linspace(-1, 1, 6), header), pack(torch.zeros(2, dtype=torch.float64), header)]
    return [_frame(m) for m in notices] + [_frame(Message.of_tensor(t, round=4, tag=11)) for t in tensors]


def lowcomm_seeds() -> list[bytes]:
    """FP4 E3M0 payloads (first byte even) and DeMo pairs for the target's model (first byte odd)."""
    x = np.linspace(-1.0, 1.0, 300).astype(np.float32)
    fp4 = [Fp4E3M0(group=g).encode(x) for g in (64, 300)] + [Fp4E3M0().encode(np.zeros(3, np.float32))]
    seeds = [bytes([2 * k]) + pack_compressed(p, FP4_SCHEMA, limits=FUZZ_LIMITS) for k, p in enumerate(fp4)]
    pairs = len(DEMO_LIMITS)
    index = np.zeros(pairs, dtype=np.int64)
    demo = payload_of(torch.from_numpy(index), torch.linspace(-1, 1, pairs), k=32, tile=4096)
    return [*seeds, b"\x01" + pack_compressed(demo, DEMO_SCHEMA, limits=FUZZ_LIMITS)]


def control_seeds() -> list[bytes]:
    """Control-socket lines as the host and the agents write them: every command of both protocols, an
    answer, and a few near misses (no newline, two lines, not an object)."""
    lines = [encode_line(c.request()) for c in AgentCommand] + [encode_line({"cmd": c.value, "token": "t" * 32})
                                                                for c in NodeCommand]
    lines += [encode_line(AgentCommand.RUN.request(job={"job_id": "j1", "entry": "noop", "rank": 0, "world_size": 1,
                                                        "peers": ["10.0.0.2"], "out_dir": "/squall/run/jobs/j1"})),
              encode_line({"ok": True, "state": "done", "exit_code": 0, "duration_s": 0.25}),
              b'{"cmd": "ping"}', b'{"cmd": "ping"}\n{"cmd": "run"}\n', b"[1, 2]\n", b'{"cmd": 7}\n']
    return lines


SEEDS: Final = {"wire": wire_seeds, "framing": framing_seeds, "udp": udp_seeds, "swarm": swarm_seeds,
                "moshpit": moshpit_seeds, "compressed": compressed_seeds, "stragglers": straggler_seeds,
                "profile": profile_seeds, "trace": trace_seeds, "lowcomm": lowcomm_seeds,
                "control": control_seeds}
#: Inputs that once were findings (``regression-*``, kept by hand) stay when the seeds are rewritten.
REGRESSION_PREFIX: Final = "regression-"


def main() -> None:
    """Rewrite every seed directory; print how much was written."""
    total = 0
    for name, make in SEEDS.items():
        directory = CORPUS / name
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.iterdir():
            if not old.name.startswith(REGRESSION_PREFIX):
                old.unlink()
        seeds = make()
        for seed in seeds:
            (directory / f"seed-{hashlib.sha1(seed).hexdigest()[:16]}").write_bytes(seed)
        total += sum(map(len, seeds))
        print(f"{name}: {len(seeds)} seeds")
    print(f"{total} bytes in all")


if __name__ == "__main__":
    main()
