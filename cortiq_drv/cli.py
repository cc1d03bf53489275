"""The `cortiq-drv` command line (DESIGN.md's contracts): argument parsing and dispatch only.

Each subcommand is a small function `_cmd_<name>(args) -> int` over the library's public API.
"""

from __future__ import annotations

import argparse
import sys

from cortiq_drv.errors import CortiqError


def _cmd_info(args) -> int:
    """Envelope, arch and a tensor table summary of a CMF file."""
    import json

    from cortiq_drv.cmf import CmfFile

    with CmfFile.open(args.model) as f:
        by_dtype: dict[str, list[int]] = {}
        for t in f.tensors.values():
            n = by_dtype.setdefault(t.dtype, [0, 0])
            n[0] += 1
            n[1] += t.nbytes
        info = {
            "path": str(args.model), "uid": f.uid, "features": f.features,
            "format": f.header.get("format"), "version": f.header.get("version"),
            "quant_type": f.header.get("quant_type"), "description": f.header.get("description"),
            "arch": f.arch, "tokenizer_config": f.header.get("tokenizer_config"),
            "vocab_bytes": len(f.vocab or b""), "tensors": len(f.tensors),
            "dtypes": {k: {"count": c, "bytes": b} for k, (c, b) in by_dtype.items()},
        }  # fmt: skip
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    for key in ("path", "uid", "format", "version", "features", "quant_type", "description"):
        print(f"{key:12} {info[key]}")
    for key, v in info["arch"].items():
        print(f"arch.{key:20} {v}")
    tc = info["tokenizer_config"] or {}
    print(f"{'eos ids':12} {tc.get('eos_token_ids')}  chat template: "
          f"{'own' if tc.get('chat_template') else 'built-in'}  vocab: {info['vocab_bytes']} bytes")
    print(f"{'tensors':12} {info['tensors']}")
    for k, d in info["dtypes"].items():
        print(f"  {k:8} {d['count']:6} tensors {d['bytes'] / 2**20:12.2f} MiB")
    return 0


def _cmd_verify(args) -> int:
    """Every hash of a CMF file; a mismatch raises CmfError naming it (exit 1)."""
    from cortiq_drv.cmf import CmfFile

    with CmfFile.open(args.model) as f:
        n = f.verify()
        print(f"{args.model}: OK ({len(f.tensors)} tensors, {n / 2**20:.1f} MiB checked)")
    return 0


def _cmd_convert(args) -> int:
    """A Hugging Face Qwen3.5 checkpoint directory to CMF."""
    from cortiq_drv.convert import convert

    out = convert(args.src_dir, args.out, quant=args.quant, progress=not args.quiet)
    print(f"wrote {out}")
    return 0


def _cmd_logits(args) -> int:
    """float32 [len(ids), vocab] logits of a prompt from a fresh sequence, saved with numpy."""
    import numpy as np

    from cortiq_drv.engine import Engine

    ids = []
    for part in args.ids.split(","):
        try:
            ids.append(int(part))
        except ValueError:
            raise CortiqError(f"--ids: {part.strip()!r} is not a token id") from None
    logits = Engine.open(args.model, device=args.device).logits(ids)
    np.save(args.out, logits)
    print(f"wrote {args.out}: float32 {list(logits.shape)}")
    return 0


def _generate(engine, prompt, max_tokens: int, sampling, spec_k: int, chat: bool) -> None:
    """Stream the answer to stdout, then the speed and speculation counters."""
    if spec_k and engine.model.graph.mtp is None:
        spec_k = 0
    gen = dict(max_tokens=max_tokens, sampling=sampling, spec_k=spec_k)
    toks = engine.chat([{"role": "user", "content": prompt}], enable_thinking=False, **gen) if chat \
        else engine.generate(prompt, **gen)
    for t in toks:
        if t.id not in engine.stop_ids:
            print(t.text, end="", flush=True)
    c = engine.counters
    arm = "the card (CUDA hybrid arm)" if engine.device == "cuda" else "the host arm (numpy)"
    print(f"\n[{engine.device}: {engine.device_reason}] ran on {arm}")
    print(f"prompt {c.prompt_tokens} tokens at {c.prompt_tps:.1f} tok/s; decode {c.decode_tokens} "
          f"tokens at {c.decode_tps:.1f} tok/s; drafts accepted {c.drafts_accepted} of "
          f"{c.drafts_proposed} in {c.verify_rounds} verify rounds (k={spec_k})")
    if engine.card is not None:
        where = "host" if engine.card.mtp_on_host else "card"
        print(f"card: {c.graphs_recorded} graphs recorded, {c.graph_replays} replays, "
              f"{c.card_declines} declines; MTP drafts on the {where}"
              + (f" ({engine.card.mtp_on_host})" if engine.card.mtp_on_host else ""))
        engine.card.report()
    if c.sealed_layers:
        f = engine.far
        print(f"far field: layers {list(c.sealed_layers)} sealed at {f.seal_at} rows "
              f"(m {f.m}, window {f.w}, sinks {f.sink})")


def _sampling(args):
    from cortiq_drv.sampling import GREEDY, Sampling

    if args.greedy:
        return GREEDY
    return Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)


def _cmd_run(args) -> int:
    """Generate from a prompt with a model, by default the embedded random-weight one."""
    from cortiq_drv.engine import Engine

    model = args.model
    if model is None:
        from cortiq_drv.default_model import default_model_path

        model = default_model_path(build=True)
    _generate(Engine.open(model, device=args.device), args.prompt, args.max_tokens,
              _sampling(args), args.spec_k, args.chat)
    return 0


def _cmd_demo(args) -> int:
    """Build the embedded default model when missing, say what it is, generate, print speeds."""
    from cortiq_drv.default_model import default_model_path
    from cortiq_drv.engine import Engine
    from cortiq_drv.sampling import GREEDY

    path = default_model_path(build=False)
    if not path.is_file():
        print(f"building the embedded default model at {path} ...", flush=True)
        default_model_path(build=True)
    engine = Engine.open(path, device=args.device)
    print(engine.model.cmf.header.get("description")
          or "the embedded default model: RANDOM weights, its text is meaningless")
    print("note: the weights are random, so the answer below is noise; it shows the engine running")
    _generate(engine, args.prompt, args.max_tokens, GREEDY, args.spec_k, True)
    return 0


def _register(sub) -> None:
    """Add every subcommand to `sub` (filled in as the commands land)."""
    p = sub.add_parser("info", help="envelope, arch and tensor summary of a CMF file")
    p.add_argument("model")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_info)
    p = sub.add_parser("verify", help="check every hash of a CMF file (exit 1 on a mismatch)")
    p.add_argument("model")
    p.set_defaults(func=_cmd_verify)
    p = sub.add_parser("convert", help="Hugging Face Qwen3.5 checkpoint directory -> CMF")
    p.add_argument("src_dir")
    p.add_argument("out")
    p.add_argument("--quant", choices=["q4tp", "q8_2f", "f16", "f32"], default="q4tp")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_convert)
    p = sub.add_parser("logits", help="float32 [len(ids), vocab] logits of a prompt -> .npy")
    p.add_argument("model")
    p.add_argument("--ids", required=True, help="comma-separated token ids, e.g. 1,2,3")
    p.add_argument("--out", required=True, help="the .npy file to write")
    _device_arg(p)
    p.set_defaults(func=_cmd_logits)
    p = sub.add_parser("run", help="generate from a prompt (default model: the embedded one)")
    p.add_argument("model", nargs="?", help="a CMF file (default: the embedded random model)")
    _gen_args(p, None)
    p.add_argument("--greedy", action="store_true", help="argmax decoding (default: sampling)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-k", type=int, default=20)
    p.add_argument("--top-p", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a chat user turn")
    _device_arg(p)
    p.set_defaults(func=_cmd_run)
    p = sub.add_parser("demo", help="run the embedded default model (random weights) and show speed")
    _gen_args(p, "Write a haiku about the sea.")
    _device_arg(p)
    p.set_defaults(func=_cmd_demo)


def _device_arg(p) -> None:
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="cuda: the card; cpu: the host arm; auto: the card when there is one that "
                        "takes the model (default)")


def _gen_args(p, prompt: str) -> None:
    p.add_argument("--prompt", required=prompt is None, default=prompt)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--spec-k", type=int, default=3, help="MTP drafts a round (0: none)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cortiq-drv", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    # Subcommands are registered here by the modules' owners (info, verify, convert, logits, run,
    # demo, serve), each with `set_defaults(func=_cmd_<name>)`.
    _register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CortiqError as e:
        print(f"cortiq-drv: error: {e}", file=sys.stderr)
        return 1
