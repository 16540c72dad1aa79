"""`llmtui model PATH_OR_ID`: what a base model is, and what each method does on it.

Read from the config alone (no weights, no download): parameters (total and active for a
mixture of experts), the linear layers by role, attention kernels, context, the tokenizer's chat
template and special tokens, and the verdict preflight gives each method on it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from tuiapp.core.common.errors import EXIT_BAD_INPUT, EXIT_OK
from tuiapp.core.common.findings import Finding
from tuiapp.core.common.jsonout import write_document
from tuiapp.core.config.recipe import BUNDLED_MODEL, METHOD_KINDS, Recipe
from tuiapp.core.machine import gpus
from tuiapp.core.plan import model_profile
from tuiapp.core.prelaunch import model_check


def add_command(add) -> None:
    p = add("model", cmd_model, "a base model's profile (parameters, layers, attention, template) and each "
            "method's verdict on it")
    p.add_argument("model", help="a local model folder, a hub id in the HF cache, or 'tiny'")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own code (trusted models)")
    p.add_argument("--json", action="store_true", help="print the profile and verdicts as one JSON document")
    p.add_argument("--dry", nargs="*", metavar="KIND", default=None,
                   help="also run the dry step (one real training step on a shrunken copy of the model) of every "
                   "method the rules accept, or of the KINDs named; cached, as at preflight")


def method_verdicts(profile: model_profile.ModelProfile, name: str) -> dict[str, dict]:
    """kind -> {'verdict': 'trains'|'refused', 'notes': [...]} with each method's defaults on this model."""
    out = {}
    cuda = gpus.cuda_available()
    flash = importlib.util.find_spec("flash_attn") is not None
    for kind in METHOD_KINDS:
        recipe = Recipe.model_validate({"model": {"name": name}, "method": {"kind": kind}})
        plan = model_profile.plan_model(profile, recipe, cuda=cuda, flash_installed=flash)
        errors = plan.errors()
        notes = [f for f in plan.findings if f.key != "model.attn_implementation"]
        out[kind] = {"verdict": "refused" if errors else "trains",
                     "notes": [_finding(f) for f in (errors or notes)], "attention": plan.attention}
    return out


def dry_verdicts(verdicts: dict[str, dict], name: str, label: str, only: list[str] | None = None) -> None:
    """The dry step of each method the rules accept (`only` those named; one child for those not
    cached), as preflight runs it: a method that fails it becomes 'refused' with the trainer's message."""
    from tuiapp.core.prelaunch import dry_step

    kinds = [k for k, v in verdicts.items() if v["verdict"] == "trains" and (not only or k in only)]
    recipes = [dry_step.method_recipe(name, k) for k in kinds]
    for kind, recipe, answer in zip(kinds, recipes, dry_step.verdicts(recipes, Path.cwd()), strict=True):
        found = dry_step.findings_of(answer, recipe, label)
        verdicts[kind]["dry"] = "skipped" if answer is None or answer.get("skipped") else \
            ("passed" if answer.get("ok") else ("no verdict" if answer.get("transient") else "failed"))
        errors = [f for f in found if f.level == "error"]
        if errors:
            verdicts[kind]["verdict"] = "refused"
            verdicts[kind]["notes"] = [_finding(f) for f in errors]


def _finding(f: Finding) -> dict:
    return {"level": f.level, "key": f.key, "message": f.message, "fix": f.fix}


def _read(name: str, trust: bool) -> model_profile.ModelProfile:
    if name == BUNDLED_MODEL:
        data = model_profile.run_profile_of(BUNDLED_MODEL, trust)
        if "error" in data:
            raise model_profile.ProfileError(data["error"])
        return model_profile.ModelProfile(data)
    folder = model_check.model_folder(name, Path.cwd())
    if folder is None:
        raise model_profile.ProfileError(f"'{name}' is neither a local model folder nor in the Hugging Face cache "
                                         f"({model_check.hub_cache()})")
    problems = model_profile.config_problems(folder)
    if problems:
        raise model_profile.ProfileError(problems[0].message, problems[0].fix)
    return model_profile.read_profile(folder, trust_remote_code=trust)


def cmd_model(args) -> int:
    try:
        profile = _read(args.model, args.trust_remote_code)
    except model_profile.ProfileError as exc:
        fix = exc.fix or "point it at a folder with config.json, or download the model (hf download ID)"
        if args.json:
            write_document(sys.stdout, {"error": {"message": exc.message, "key": "model", "fix": fix}})
        print(f"error: {exc.message}\n  fix: {fix}", file=sys.stderr)
        return EXIT_BAD_INPUT
    verdicts = method_verdicts(profile, args.model)
    dry = getattr(args, "dry", None)
    if dry is not None:
        unknown = [k for k in dry if k not in verdicts]
        if unknown:
            print(f"error: --dry {' '.join(unknown)}: not a method kind\n  fix: use some of {', '.join(verdicts)}",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
        dry_verdicts(verdicts, args.model, profile.label, dry)
    if args.json:
        write_document(sys.stdout, {"model": args.model, "profile": profile.data, "methods": verdicts})
        return EXIT_OK
    print(describe(profile, args.model))
    print(describe_verdicts(verdicts))
    return EXIT_OK


def _n(value) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def describe(profile: model_profile.ModelProfile, name: str) -> str:
    d = profile.data
    params = d["parameters"]
    lines = [f"{profile.label}  {name}"]
    moe = profile.moe
    counts = f"{_n(params['total'])} total"
    if moe:
        counts += (f" · {_n(params['active'])} active per token ({moe['experts']} experts, "
                   f"{moe['active_experts']} per token; experts hold {_n(params['experts'])})")
    counts += f" · embeddings {_n(params['embedding'])} ({'tied to' if d['tied_embeddings'] else 'apart from'} lm_head)"
    lines.append(f"  parameters  {counts}")
    rope = d.get("rope_scaling")
    lines.append(f"  shape       {d.get('layers')} layers · hidden {_n(d.get('hidden_size'))} · vocab "
                 f"{_n(d.get('vocab_size'))} · context {_n(d.get('context_length'))}"
                 + (f" · rope scaling {rope.get('rope_type', rope)}" if isinstance(rope, dict) else "")
                 + (f" · weights {d['dtype']}" if d.get("dtype") else ""))
    lines.append(f"  kernels     {', '.join(profile.attention)} (attention implementations it supports)")
    for role in ("attention", "mlp", "experts", "router", "embedding", "lm_head"):
        if profile.roles.get(role):
            lines.append(f"  {role:<11} {' '.join(profile.roles[role])}")
    tok = profile.tokenizer
    if tok and "error" not in tok:
        pad = tok.get("pad_token")
        lines.append(f"  tokenizer   {_n(tok.get('size'))} tokens · chat template: "
                     f"{'yes' if tok.get('chat_template') else 'none (set dataset.template)'} · eos "
                     f"{tok.get('eos_token')} · pad " + (f"{pad}" + (" (= eos)" if tok.get("pad_is_eos") else "")
                                                          if pad else "none (eos pads)"))
    elif tok:
        lines.append(f"  tokenizer   cannot be loaded: {tok['error']}")
    if moe:
        lines.append(f"  experts     implementation {moe.get('experts_implementation') or 'eager'} · router aux loss "
                     f"coefficient {moe.get('router_aux_loss_coef')}")
    return "\n".join(lines)


def describe_verdicts(verdicts: dict[str, dict]) -> str:
    lines = ["  methods"]
    for kind, v in verdicts.items():
        mark = "ok " if v["verdict"] == "trains" else "no "
        first = v["notes"][0]["message"] if v["notes"] else ""
        dry = f"[dry step {v['dry']}] " if v.get("dry") else ""
        lines.append(f"    {mark}{kind:<14}{dry}{first}")
        if v["verdict"] == "refused" and v["notes"][0].get("fix"):
            lines.append(f"    {'':<17}fix: {v['notes'][0]['fix']}")
    return "\n".join(lines)
