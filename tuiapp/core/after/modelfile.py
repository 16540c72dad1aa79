"""An Ollama Modelfile for an exported model: its TEMPLATE and stop tokens derived from the chat
template the model trained with, its PARAMETERs from the recipe's [generate] table.

Pure: the chat template is reached through `render(messages, add_generation_prompt) -> str`
(tuiapp.trainer.tools.gguf gives the tokenizer's own, as training rendered it). `derive()` renders a
few conversations whose contents are marker words and reads the pieces around the markers:

    bos + [spre SYSTEM spost] + (upre USER upost + apre ASSISTANT apost)* + gen

then checks that the pieces rebuild every probe exactly, so a template they cannot express is
refused (ChatTemplateError) rather than written wrong. A system prompt is either a turn of its
own (ChatML, Llama 3), folded into the first user turn (Gemma), or not supported at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

Render = Callable[[list, bool], str]

SYS, U1, A1, U2, A2, U3 = "Qxsystemzq", "Qxuseronezq", "Qxassistantonezq", "Qxusertwozq", "Qxassistanttwozq", \
    "Qxuserthreezq"


class ChatTemplateError(ValueError):
    """The chat template does not fit the turn structure a Modelfile TEMPLATE can express."""


@dataclass
class ChatFormat:
    bos: str = ""
    upre: str = ""
    upost: str = ""
    apre: str = ""
    apost: str = ""
    gen: str = ""
    system_mode: str = "turn"  # turn | fold | none
    spre: str = ""
    spost: str = ""
    fold_sep: str = ""
    default_system: str | None = None  # None: no system block without a system prompt
    stops: list[str] = field(default_factory=list)


def _u(text):
    return {"role": "user", "content": text}


def _a(text):
    return {"role": "assistant", "content": text}


def _s(text):
    return {"role": "system", "content": text}


def _pieces(text: str, markers: list[str]) -> list[str]:
    """The text between the markers, in order: len(markers) + 1 pieces."""
    out, rest = [], text
    for marker in markers:
        at = rest.find(marker)
        if at < 0:
            raise ChatTemplateError(f"the chat template dropped or changed a message's content ({marker!r})")
        out.append(rest[:at])
        rest = rest[at + len(marker):]
    return [*out, rest]


def _common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def derive(render: Render, bos_token: str | None = None, eos_token: str | None = None,
           special_tokens: list[str] | None = None) -> ChatFormat:
    """The template's pieces (see the module doc); ChatTemplateError when it does not fit."""
    try:
        one = render([_u(U1)], False)
        one_gen = render([_u(U1)], True)
        three = render([_u(U1), _a(A1), _u(U2)], False)
    except Exception as exc:  # a template that raises on a plain user/assistant chat
        raise ChatTemplateError(f"the chat template fails on a plain conversation: {exc}") from None
    head, upost = _pieces(one, [U1])
    if not one_gen.startswith(one):
        raise ChatTemplateError("the generation prompt does not extend the conversation")
    gen = one_gen[len(one):]
    head3, mid1, mid2, tail = _pieces(three, [U1, A1, U2])
    if head3 != head or tail != upost or not mid1.startswith(upost):
        raise ChatTemplateError("user turns are not rendered the same way each time")
    apre = mid1[len(upost):]
    # mid2 = apost + upre, and head ends with upre: split where upre opens its turn the way apre does
    best = None
    for k in range(len(mid2) + 1):
        candidate = mid2[k:]
        if head.endswith(candidate):
            score = _common_prefix(candidate, apre)
            if best is None or score > best[0]:
                best = (score, k)
    if best is None:
        raise ChatTemplateError("cannot find where a user turn begins")
    apost, upre = mid2[:best[1]], mid2[best[1]:]
    prefix = head[:len(head) - len(upre)]
    bos = bos_token if bos_token and prefix.startswith(bos_token) else ""
    fmt = ChatFormat(bos=bos, upre=upre, upost=upost, apre=apre, apost=apost, gen=gen)
    _derive_system(fmt, render, prefix[len(bos):], head)
    fmt.stops = stop_tokens(fmt, eos_token, special_tokens or [])
    probes = [[_u(U1)], [_u(U1), _a(A1), _u(U2)], [_u(U1), _a(A1), _u(U2), _a(A2), _u(U3)]]
    if fmt.system_mode != "none":
        probes += [[_s(SYS), _u(U1)], [_s(SYS), _u(U1), _a(A1), _u(U2)]]
    for messages in probes:
        for gen_prompt in (False, True):
            if render(messages, gen_prompt) != render_format(fmt, messages, gen_prompt):
                raise ChatTemplateError("the chat template renders turns differently by position (for example the "
                                        "last assistant turn, or one marked by index), which a Modelfile "
                                        "TEMPLATE here cannot express")
    return fmt


def _derive_system(fmt: ChatFormat, render: Render, start: str, head: str) -> None:
    try:
        with_system = render([_s(SYS), _u(U1)], False)
    except Exception:  # the template refuses system turns
        fmt.system_mode = "none"
        if start:
            raise ChatTemplateError("the chat template starts with text a Modelfile cannot place") from None
        return
    before, between, after = _pieces(with_system, [SYS, U1])
    if between.endswith(fmt.upre) and before.startswith(fmt.bos):
        fmt.system_mode = "turn"
        fmt.spre = before[len(fmt.bos):]
        fmt.spost = between[:len(between) - len(fmt.upre)]
        if start:  # a block without a system prompt: the template's default system
            if not (start.startswith(fmt.spre) and start.endswith(fmt.spost)) or len(start) < len(fmt.spre) + len(
                    fmt.spost):
                raise ChatTemplateError("the chat template starts with text a Modelfile cannot place")
            fmt.default_system = start[len(fmt.spre):len(start) - len(fmt.spost)]
        return
    if before == head and not start.strip(fmt.bos):
        fmt.system_mode, fmt.fold_sep = "fold", between
        return
    raise ChatTemplateError("the chat template places the system prompt in a way a Modelfile cannot express")


def stop_tokens(fmt: ChatFormat, eos_token: str | None, special_tokens: list[str]) -> list[str]:
    """What ends an answer: the special tokens closing an assistant turn, the token that opens the
    next turn, and the tokenizer's eos."""
    stops: list[str] = []
    specials = sorted({t for t in special_tokens if t}, key=len, reverse=True)

    def found(text: str) -> list[str]:
        hits = []
        for token in specials:
            at = text.find(token)
            if at >= 0:
                hits.append((at, token))
        return [token for _, token in sorted(hits)]

    ends = found(fmt.apost)
    stops += ends or ([fmt.apost.strip()] if fmt.apost.strip() else [])  # plain text ends a turn too
    stops += found(fmt.upre)[:1]
    if eos_token:
        stops.append(eos_token)
    return list(dict.fromkeys(stops))


def render_format(fmt: ChatFormat, messages: list[dict], add_generation_prompt: bool) -> str:
    """What the TEMPLATE renders, in Python: how `derive` checks its pieces."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    out = fmt.bos
    if fmt.system_mode == "turn" and (system or fmt.default_system is not None):
        out += fmt.spre + (system or fmt.default_system or "") + fmt.spost
    first = True
    for message in messages:
        if message["role"] == "user":
            folded = system + fmt.fold_sep if fmt.system_mode == "fold" and first and system else ""
            out += fmt.upre + folded + message["content"] + fmt.upost
            first = False
        elif message["role"] == "assistant":
            out += fmt.apre + message["content"] + fmt.apost
    return out + (fmt.gen if add_generation_prompt else "")


# ---------------------------------------------------------------- the Modelfile


def _go(text: str) -> str:
    """Literal text inside a Go template: only `{{` needs care."""
    return text.replace("{{", '{{ "{{" }}')


def go_template(fmt: ChatFormat, include_bos: bool = False) -> str:
    """The Ollama TEMPLATE (Go text/template over .System and .Messages). The bos token is left to
    the runtime (llama.cpp adds it when the GGUF says so) unless include_bos."""
    parts = [_go(fmt.bos) if include_bos else ""]
    if fmt.system_mode == "turn":
        block = f"{_go(fmt.spre)}{{{{ .System }}}}{_go(fmt.spost)}"
        parts.append(block if fmt.default_system is not None else f"{{{{ if .System }}}}{block}{{{{ end }}}}")
    parts.append("{{ $first := true }}" if fmt.system_mode == "fold" else "")
    fold = ("{{ if and $first $.System }}{{ $.System }}" + _go(fmt.fold_sep) + "{{ end }}{{ $first = false }}"
            if fmt.system_mode == "fold" else "")
    parts.append(
        "{{ range $i, $_ := .Messages }}"
        "{{ $last := eq (len (slice $.Messages $i)) 1 }}"
        f'{{{{ if eq .Role "user" }}}}{_go(fmt.upre)}{fold}{{{{ .Content }}}}{_go(fmt.upost)}'
        f"{{{{ if $last }}}}{_go(fmt.gen)}{{{{ end }}}}"
        f'{{{{ else if eq .Role "assistant" }}}}{_go(fmt.apre)}{{{{ .Content }}}}'
        f"{{{{ if not $last }}}}{_go(fmt.apost)}{{{{ end }}}}"
        "{{ end }}"
        "{{ end }}")
    return "".join(parts)


def _quoted(text: str) -> str:
    if '"""' in text:
        raise ChatTemplateError('the template or system prompt contains """, which a Modelfile cannot quote')
    return f'"""{text}"""'


def _param_value(value) -> str:
    return f'"{value}"' if isinstance(value, str) else (f"{value:g}" if isinstance(value, float) else str(value))


def modelfile(source: str, fmt: ChatFormat, generate: dict | None = None, comment: str = "") -> str:
    """The Modelfile text: FROM `source` (a GGUF file or a model folder, relative to the Modelfile),
    TEMPLATE, SYSTEM (the recipe's generate.system, else the template's default), stop and the
    generation PARAMETERs (temperature, top_p, repeat_penalty, num_predict)."""
    generate = generate or {}
    lines = [f"# {line}" for line in comment.splitlines()] if comment else []
    lines += [f"FROM {source}", f"TEMPLATE {_quoted(go_template(fmt))}"]
    system = generate.get("system") or fmt.default_system or ""
    if system and fmt.system_mode != "none":
        lines.append(f"SYSTEM {_quoted(system)}")
    lines += [f"PARAMETER stop {_param_value(stop)}" for stop in fmt.stops]
    for key, name in (("temperature", "temperature"), ("top_p", "top_p"), ("repetition_penalty", "repeat_penalty"),
                      ("max_new_tokens", "num_predict")):
        if generate.get(key) is not None:
            lines.append(f"PARAMETER {name} {_param_value(generate[key])}")
    return "\n".join(lines) + "\n"
