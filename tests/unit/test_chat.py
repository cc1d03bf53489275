"""Chat prompts: the built-in Qwen3.5 format pinned by golden strings, and a checkpoint-style Jinja
template rendered with Hugging Face semantics."""

import re

import jinja2
import pytest
import tokenizers
from tokenizers.models import WordLevel

from cortiq_drv.chat import QWEN35_STOP_IDS, ChatTemplate, render_qwen35, stop_ids
from cortiq_drv.errors import CortiqError
from cortiq_drv.tokenizer import Tokenizer

GOLDEN = {
    "single_turn": (
        [{"role": "user", "content": "Hi"}],
        {},
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n",
    ),
    "system_multi_turn": (
        [
            {"role": "system", "content": "You are Qwen."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "2+2?"},
        ],
        {},
        "<|im_start|>system\nYou are Qwen.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n",
    ),
    "thinking_off": (
        [{"role": "user", "content": "Hi"}],
        {"enable_thinking": False},
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    ),
    "reasoning_drop": (
        [
            {"role": "user", "content": "A"},
            {"role": "assistant", "content": "<think>\nplan A\n</think>\n\nAnswer A"},
            {"role": "user", "content": "B"},
            {"role": "assistant", "content": "Answer B", "reasoning_content": "plan B"},
            {"role": "user", "content": "C"},
            {"role": "assistant", "content": "\n\nAnswer C", "reasoning_content": "\nplan C\n"},
        ],
        {"add_generation_prompt": False},
        "<|im_start|>user\nA<|im_end|>\n"
        "<|im_start|>assistant\nAnswer A<|im_end|>\n"
        "<|im_start|>user\nB<|im_end|>\n"
        "<|im_start|>assistant\nAnswer B<|im_end|>\n"
        "<|im_start|>user\nC<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nplan C\n</think>\n\nAnswer C<|im_end|>\n",
    ),
    "tool_response": (
        [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "need tools",
                "tool_calls": [
                    {"type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                    {"function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
                ],
            },  # fmt: skip
            {"role": "tool", "content": "18C"},
            {"role": "tool", "content": "21C"},
        ],
        {},
        "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nneed tools\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n"
        "<tool_response>\n21C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n",
    ),
    "tool_loop_keeps_reasoning": (
        [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "<think>\nlook up\n</think>\n\nChecking.",
             "tool_calls": [{"name": "f", "arguments": {}}]},
            {"role": "user", "content": "<tool_response>\nok\n</tool_response>"},
            {"role": "assistant", "content": "Done.", "reasoning_content": "got it"},
        ],  # fmt: skip
        {"add_generation_prompt": False},
        "<|im_start|>user\nQ<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nlook up\n</think>\n\nChecking.\n"
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\ngot it\n</think>\n\nDone.<|im_end|>\n",
    ),
    "tools_in_system": (
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        {"tools": [{"type": "function", "function": {"name": "天气", "parameters": {}}}]},
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist "
        "with the user query.\n\nYou are provided with function signatures within <tools></tools> "
        'XML tags:\n<tools>\n{"type": "function", "function": {"name": "天气", "parameters": {}}}\n'
        "</tools>\n\nFor each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n",
    ),
    "content_parts_and_late_system": (
        [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"},
                                         {"type": "text", "text": "b"}]},
            {"role": "system", "content": "late"},
            {"role": "assistant", "content": None},
        ],  # fmt: skip
        {"add_generation_prompt": False},
        "<|im_start|>user\nab<|im_end|>\n<|im_start|>system\nlate<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n<|im_end|>\n",
    ),
}


@pytest.mark.parametrize("name", list(GOLDEN))
def test_builtin_golden(name):
    messages, kwargs, expect = GOLDEN[name]
    assert render_qwen35(messages, **kwargs) == expect
    # No template in the file: ChatTemplate renders the built-in format.
    template = ChatTemplate.from_config({"eos_token_ids": [248046]})
    assert template.builtin
    assert template.render(messages, **kwargs) == expect


def test_builtin_unknown_role():
    with pytest.raises(CortiqError, match="message 1: unknown role 'robot'"):
        render_qwen35([{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}])


@pytest.mark.parametrize("cfg, ids", [
    (None, (248046, 248044)), ({}, QWEN35_STOP_IDS), ({"eos_token_ids": []}, QWEN35_STOP_IDS),
    ({"eos_token_ids": [2, 7]}, (2, 7)), ({"eos_token_ids": 5}, (5,)),
])  # fmt: skip
def test_stop_ids(cfg, ids):
    assert stop_ids(cfg) == ids


# A checkpoint-style template: indented block tags on their own lines (lstrip_blocks), newline after
# each block tag dropped (trim_blocks), `tojson`, `raise_exception`, the HF variables.
QWEN_STYLE = """{% for message in messages %}
    {% if loop.first and message.role != 'system' %}
<|im_start|>system
You are helpful.<|im_end|>
    {% endif %}
    {% if message.role not in ('system', 'user', 'assistant') %}
        {{ raise_exception('role ' + message.role + ' not allowed') }}
    {% endif %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{% if tools %}
<|im_start|>system
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
<|im_end|>
{% endif %}
{% if add_generation_prompt %}
<|im_start|>assistant
    {% if enable_thinking is defined and enable_thinking is false %}
<think>

</think>

    {% endif %}
{% endif %}"""


def test_jinja_hf_semantics():
    t = ChatTemplate(QWEN_STYLE)
    msgs = [{"role": "user", "content": "Hi"}]
    head = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    assert not t.builtin
    assert t.render(msgs) == head + "<|im_start|>assistant\n"
    no_think = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert t.render(msgs, enable_thinking=False) == head + no_think
    assert t.render(msgs, add_generation_prompt=False) == head
    tools = [{"name": "天气", "parameters": {"city": "string"}}]
    assert t.render(msgs, tools=tools, add_generation_prompt=False) == (
        head + '<|im_start|>system\n{"name": "天气", "parameters": {"city": "string"}}\n<|im_end|>\n'
    )
    # The same text without trim_blocks / lstrip_blocks keeps the indentation and blank lines.
    plain = jinja2.Environment().from_string(QWEN_STYLE).render(
        messages=msgs, add_generation_prompt=True, enable_thinking=True
    )
    assert plain != t.render(msgs) and "    \n" in plain


def test_jinja_raise_exception_and_sandbox():
    t = ChatTemplate(QWEN_STYLE)
    with pytest.raises(CortiqError, match="chat template: role tool not allowed"):
        t.render([{"role": "tool", "content": "x"}])
    sneaky = ChatTemplate("{{ messages.append(1) }}")
    with pytest.raises(CortiqError, match="chat template"):
        sneaky.render([])
    with pytest.raises(CortiqError, match="does not compile"):
        ChatTemplate("{% if %}")


def _tiny_tokenizer() -> Tokenizer:
    inner = tokenizers.Tokenizer(WordLevel({"<s>": 0, "</s>": 1, "hi": 2}, unk_token="hi"))
    inner.add_special_tokens(["<s>", "</s>"])
    return Tokenizer(inner)


def test_from_config_bos_eos_and_named_templates():
    cfg = {
        "chat_template": [
            {"name": "tool_use", "template": "unused"},
            {"name": "default",
             "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"
                         "|{{ strftime_now('%Y') }}"},
        ],
        "bos_token_id": 0,
        "eos_token_ids": [1, 2],
    }  # fmt: skip
    t = ChatTemplate.from_config(cfg, _tiny_tokenizer())
    out = t.render([{"role": "user", "content": "x"}])
    assert re.fullmatch(r"<s>x</s>\|\d{4}", out), out
    # Without a tokenizer the template sees empty BOS / EOS (as HF does for unset tokens).
    assert ChatTemplate.from_config(cfg).render([{"content": "x"}]).startswith("x|")
