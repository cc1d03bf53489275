"""Chat prompts: a checkpoint's Jinja chat template rendered with Hugging Face semantics, and the
built-in Qwen3.5 ChatML-with-thinking format as the fallback (docs/TOKENIZER.md).

Hugging Face semantics (transformers' `apply_chat_template`): a sandboxed Jinja environment with
`trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `tojson` filter that keeps
non-ASCII text, `raise_exception(msg)` and `strftime_now(fmt)` as globals, and the variables
`messages`, `tools`, `add_generation_prompt`, `enable_thinking`, `bos_token`, `eos_token`.
"""

from __future__ import annotations

import json
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import CortiqError
from .vocab import QWEN35_STOP_IDS


_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def stop_ids(tokenizer_config: dict | None) -> tuple[int, ...]:
    """Ids that end generation: the file's `tokenizer_config.eos_token_ids` (a list or one id), else
    Qwen3.5's `<|im_end|>`, `<|endoftext|>`."""
    ids = (tokenizer_config or {}).get("eos_token_ids")
    if ids is None or ids == []:
        return QWEN35_STOP_IDS
    if isinstance(ids, int):
        return (ids,)
    return tuple(int(i) for i in ids)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def environment() -> ImmutableSandboxedEnvironment:
    """The Jinja environment transformers compiles chat templates in."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _text(content) -> str:
    """A message's content as text: a string, None, or OpenAI-style parts (text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if p.get("type", "text") == "text")


def _is_tool_response(m: dict) -> bool:
    t = _text(m.get("content"))
    return t.startswith("<tool_response>") and t.endswith("</tool_response>")


def _last_query(messages: list[dict]) -> int:
    """Index of the last real user query (a user turn that is not a wrapped tool response)."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.get("role") == "user" and not _is_tool_response(m):
            return i
    return len(messages) - 1


def _split_reasoning(m: dict) -> tuple[str, str]:
    """(reasoning, answer) of an assistant turn: `reasoning_content`, else the `<think>` block
    written at the head of the content."""
    content = _text(m.get("content"))
    reasoning = m.get("reasoning_content")
    if isinstance(reasoning, str):
        return reasoning, content
    if "</think>" in content:
        head, _, tail = content.rpartition("</think>")
        return head.rstrip("\n").split("<think>")[-1].lstrip("\n"), tail.lstrip("\n")
    return "", content


def _tool_calls(calls) -> str:
    out = []
    for call in calls or ():
        fn = call.get("function", call)
        args = fn.get("arguments", {})
        args = args if isinstance(args, str) else _tojson(args)
        out.append(f'<tool_call>\n{{"name": "{fn["name"]}", "arguments": {args}}}\n</tool_call>')
    return "\n".join(out)


def _assistant(m: dict, after_query: bool) -> str:
    """One assistant turn; its reasoning is kept only after the last user query."""
    reasoning, answer = _split_reasoning(m)
    head = ""
    if after_query:
        thought = reasoning.strip("\n")
        head = f"<think>\n{thought}\n</think>\n\n"
        answer = answer.lstrip("\n")
    calls = _tool_calls(m.get("tool_calls"))
    if calls:
        answer = f"{answer}\n{calls}" if answer else calls
    return f"<|im_start|>assistant\n{head}{answer}<|im_end|>\n"


def _system(messages: list[dict], tools) -> str:
    """The opening system turn: the first message when it is a system one, plus the tool list."""
    first = None
    if messages and messages[0].get("role") == "system":
        first = _text(messages[0].get("content"))
    if not tools:
        return "" if first is None else f"<|im_start|>system\n{first}<|im_end|>\n"
    listing = "".join("\n" + _tojson(t) for t in tools)
    lead = "" if first is None else first + "\n\n"
    return f"<|im_start|>system\n{lead}{_TOOLS_HEAD}{listing}{_TOOLS_TAIL}<|im_end|>\n"


def render_qwen35(messages: list[dict], *, add_generation_prompt: bool = True,
                  enable_thinking: bool = True, tools=None) -> str:  # fmt: skip
    """The built-in Qwen3.5 ChatML prompt: `<|im_start|>role\\n...<|im_end|>\\n` turns; consecutive
    tool results as one user turn of `<tool_response>` blocks; the generation prompt
    `<|im_start|>assistant\\n` + `<think>\\n` (thinking) or `<think>\\n\\n</think>\\n\\n` (not)."""
    out = [_system(messages, tools)]
    last = _last_query(messages)
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "system" and i == 0:
            continue
        if role in ("system", "user"):
            out.append(f"<|im_start|>{role}\n{_text(m.get('content'))}<|im_end|>\n")
        elif role == "assistant":
            out.append(_assistant(m, i > last))
        elif role == "tool":
            opens = i == 0 or messages[i - 1].get("role") != "tool"
            closes = i == len(messages) - 1 or messages[i + 1].get("role") != "tool"
            out.append("<|im_start|>user" if opens else "")
            out.append(f"\n<tool_response>\n{_text(m.get('content'))}\n</tool_response>")
            out.append("<|im_end|>\n" if closes else "")
        else:
            raise CortiqError(f"chat message {i}: unknown role {role!r}")
    if add_generation_prompt:
        think = "<think>\n" if enable_thinking else "<think>\n\n</think>\n\n"
        out.append("<|im_start|>assistant\n" + think)
    return "".join(out)


def _pick_template(source) -> str | None:
    """A `chat_template` value: a string, or Hugging Face's list of named templates ("default")."""
    if source is None or isinstance(source, str):
        return source
    named = {t.get("name"): t.get("template") for t in source}
    return named.get("default")


class ChatTemplate:
    """Renders chat messages to the prompt text: the checkpoint's Jinja template when it has one,
    else the built-in Qwen3.5 format (`builtin` is True)."""

    def __init__(self, source: str | None = None, *, bos_token: str = "", eos_token: str = ""):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.builtin = source is None
        self._compiled = None
        if source is not None:
            try:
                self._compiled = environment().from_string(source)
            except jinja2.TemplateError as e:
                raise CortiqError(f"chat template does not compile: {e}") from e

    @classmethod
    def from_config(cls, tokenizer_config: dict | None, tokenizer=None) -> ChatTemplate:
        """From a CMF header's `tokenizer_config` (`chat_template`, `bos_token_id`,
        `eos_token_ids`); `tokenizer` (a `Tokenizer`) names the template's BOS / EOS tokens."""
        cfg = tokenizer_config or {}
        bos = eos = ""
        if tokenizer is not None:
            bos_id = cfg.get("bos_token_id")
            if bos_id is not None:
                bos = tokenizer.id_to_token(bos_id) or ""
            eos = tokenizer.id_to_token(stop_ids(cfg)[0]) or ""
        return cls(_pick_template(cfg.get("chat_template")), bos_token=bos, eos_token=eos)

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True,
               enable_thinking: bool = True, tools=None, **extra) -> str:  # fmt: skip
        """The prompt text for `messages` (dicts with `role`, `content`, optionally
        `reasoning_content`, `tool_calls`); `extra` are further template variables."""
        if self._compiled is None:
            return render_qwen35(
                messages, add_generation_prompt=add_generation_prompt,
                enable_thinking=enable_thinking, tools=tools,
            )  # fmt: skip
        try:
            return self._compiled.render(
                messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                enable_thinking=enable_thinking, bos_token=self.bos_token,
                eos_token=self.eos_token, **extra,
            )  # fmt: skip
        except jinja2.TemplateError as e:
            raise CortiqError(f"chat template: {e}") from e
