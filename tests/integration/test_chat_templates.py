"""Chat templates: graphswap's built-in renderers vs the published Jinja templates, byte for byte.

The templates are the model cards' own (tests/data/templates/: Qwen3, Llama-3.1). The reference
rendering uses jinja2 configured as transformers configures it for apply_chat_template
(transformers/utils/chat_template_utils.py, _compile_jinja_template: ImmutableSandboxedEnvironment
with trim_blocks, lstrip_blocks and the loopcontrols extension; tojson = json.dumps with
ensure_ascii=False; raise_exception; strftime_now), and continue_final_message cuts the rendering the
way transformers 5.x does (a tag appended to the final content marks where the rendering is cut;
right-stripped when the template trimmed the content).
Messages reach the template as vLLM hands them over: list-of-text-parts content joined with "\\n",
null content as "", tool-call arguments parsed from their JSON string (vllm/entrypoints/chat_utils.py,
_postprocess_messages), so the templates' tojson re-dumps them as Python's json.dumps does.

graphswap's side: POST /tokenize {"messages", add_generation_prompt, continue_final_message,
chat_template_kwargs} -> token ids -> POST /detokenize (byte-level BPE round-trips every byte, so
the text is exactly the rendering). Also: the vLLM request fields' validation, and that
/v1/chat/completions feeds the model the same tokens as /tokenize.

Needs jinja2 (Debian: python3-jinja2); without it the test is skipped with a message
(exit 77, which ctest reports as SKIPPED).
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""

import json
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_http_basic import Checker, Server, gs_bin, mkmodel, post, scratch, _kill_all  # noqa: E402

try:
    import jinja2
    import jinja2.ext
    import jinja2.sandbox
except ImportError:
    jinja2 = None

SRC = os.environ.get("GS_SOURCE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TEMPLATES = os.path.join(SRC, "tests", "data", "templates")


def jinja_env():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def flat(messages):
    out = []
    for m in messages:
        m = dict(m)
        if m.get("content") is None:  # vLLM hands a null content over as ""
            m["content"] = ""
        if isinstance(m.get("content"), list):
            m["content"] = "\n".join(p["text"] for p in m["content"])
        if m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list):
            # vLLM's _postprocess_messages: arguments strings are parsed (empty: {}), an empty list dropped
            if not m["tool_calls"]:
                del m["tool_calls"]
            else:
                m["tool_calls"] = [dict(c, function=dict(c["function"], arguments=json.loads(c["function"]["arguments"] or "{}")))
                                   for c in m["tool_calls"]]
        out.append(m)
    return out


def reference(tmpl, messages, bos, add_generation_prompt=True, continue_final_message=False, kwargs=None):
    msgs = flat(messages)
    tag = "CONTINUE_FINAL_MESSAGE_TAG "
    if continue_final_message:  # as transformers 5.x render_jinja_template (utils/chat_template_utils.py)
        msgs[-1]["content"] = msgs[-1]["content"] + tag
    text = tmpl.render(messages=msgs, bos_token=bos, eos_token="", add_generation_prompt=add_generation_prompt,
                       **(kwargs or {}))
    if continue_final_message:
        loc = text.rindex(tag.strip())
        text = text[:loc] if text[loc:loc + len(tag)] == tag else text[:loc].rstrip()
    return text


def rendered(C, srv, body):
    r = post(srv, "/tokenize", body)
    if r.status != 200:
        return r
    d = post(srv, "/detokenize", {"tokens": r.json["tokens"]})
    return d.json["prompt"] if d.status == 200 else d


SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello!"}
A1 = {"role": "assistant", "content": "Hi there. How can I help?"}
U2 = {"role": "user", "content": "What is 2+2?"}

ARGS = ('{"q":"caf\\u00e9 \\"x\\" \\ud83d\\ude00\\n\\t/","n":[1,2.50,-0,-0.0,1e20,1.5e-7,3.0,12345678901234567890,'
        '0.1,1e16,123456789012345.6,1E-4,0.00001],"o":{},"a":[],"b":[true,false,null],"nested":{"k":{"z":[{"y":1}]}}}')

# (name, messages, options) -- options: add_generation_prompt, continue_final_message, enable_thinking
COMMON = [
    ("one user", [U1], {}),
    ("system + user", [SYS, U1], {}),
    ("multi-turn", [SYS, U1, A1, U2], {}),
    ("no generation prompt", [SYS, U1, A1], {"add_generation_prompt": False}),
    ("list parts", [{"role": "user", "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": "hi"}]}],
     {}),
    ("whitespace", [{"role": "system", "content": "  spaced system \n"}, {"role": "user", "content": "\n\tHello \u3000"},
                    {"role": "assistant", "content": " padded\u00a0"}, {"role": "user", "content": "  x  "}], {}),
    ("empty user", [{"role": "user", "content": ""}], {}),
    ("unicode", [{"role": "user", "content": "\u4f60\u597d\uff0c\u4e16\u754c \U0001F600 caf\u00e9 \u0928\u092e\u0938\u094d\u0924\u0947"}],
     {}),
    ("system later", [U1, A1, {"role": "system", "content": "Be brief."}, U2], {}),
    ("null assistant content", [U1, {"role": "assistant", "content": None}, U2], {}),
    ("continue final", [U1, {"role": "assistant", "content": "Sure, the answer is"}],
     {"add_generation_prompt": False, "continue_final_message": True}),
    ("continue final with spaces", [U1, {"role": "assistant", "content": "  The answer:  "}],
     {"add_generation_prompt": False, "continue_final_message": True}),
    ("tool result", [U1, {"role": "assistant", "content": "Let me look."}, {"role": "tool", "content": "22 C, sunny"},
                     {"role": "tool", "content": "{\"ok\": true}\nline2"}], {}),
    ("special text in content", [{"role": "user", "content": "tokens <|im_start|> and <|eot_id|> as text"}], {}),
    ("one tool call", [U1, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                       {"role": "tool", "content": "sunny"}], {}),
    ("tool call arguments re-dumped", [U1, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": ARGS}}]}], {"add_generation_prompt": False}),
    ("empty tool call arguments, empty tool_calls list", [U1, {"role": "assistant", "content": "x", "tool_calls": []},
                                                         U2, {"role": "assistant", "content": "", "tool_calls": [
                                                             {"function": {"name": "g", "arguments": ""}}]}],
     {"add_generation_prompt": False}),
]

QWEN3_ONLY = [
    ("enable_thinking false", [U1], {"enable_thinking": False}),
    ("enable_thinking true", [SYS, U1], {"enable_thinking": True}),
    ("enable_thinking false, no generation prompt", [U1, A1], {"enable_thinking": False,
                                                               "add_generation_prompt": False}),
    ("think in last assistant", [U1, {"role": "assistant", "content": "<think>\nplan it\n</think>\n\nDone."}],
     {"add_generation_prompt": False}),
    ("think in history is dropped", [U1, {"role": "assistant", "content": "<think>old</think>Answer one."}, U2], {}),
    ("reasoning_content", [U1, {"role": "assistant", "content": "Four.", "reasoning_content": "\n2+2=4\n"}],
     {"add_generation_prompt": False}),
    ("reasoning_content in history", [U1, {"role": "assistant", "content": "Four.", "reasoning_content": "r"}, U2], {}),
    ("empty think", [U1, {"role": "assistant", "content": "<think></think>x"}], {"add_generation_prompt": False}),
    ("nested think tags", [U1, {"role": "assistant", "content": "a<think>b<think>c\n</think>d</think>\n\ne"}],
     {"add_generation_prompt": False}),
    ("tool calls", [SYS, U1,
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"id": "c1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                    {"role": "tool", "content": "sunny"}], {}),
    ("tool calls after text, two calls", [U1,
                                          {"role": "assistant", "content": "Checking.", "tool_calls": [
                                              {"function": {"name": "a", "arguments": "{}"}},
                                              {"function": {"name": "b", "arguments": "{\"x\": 1}"}}]},
                                          {"role": "tool", "content": "A"}, {"role": "tool", "content": "B"},
                                          {"role": "assistant", "content": "<think>t</think>Both done."}],
     {"add_generation_prompt": False}),
    ("multi-step tool (user tool_response)", [U1, {"role": "assistant", "content": "<think>x</think>call"},
                                               {"role": "user", "content": "<tool_response>r</tool_response>"},
                                               {"role": "assistant", "content": "<think>y</think>final"}],
     {"add_generation_prompt": False}),
    ("continue final after thinking", [U1, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nPartial"}],
     {"add_generation_prompt": False, "continue_final_message": True}),
]


def body_of(messages, opts):
    b = {"messages": messages}
    for k in ("add_generation_prompt", "continue_final_message"):
        if k in opts:
            b[k] = opts[k]
    kw = {k: opts[k] for k in ("enable_thinking", "date_string") if k in opts}
    if kw:
        b["chat_template_kwargs"] = kw
    return b


def run_table(C, srv, tmpl, bos, cases, family):
    for name, msgs, opts in cases:
        kwargs = {k: opts[k] for k in ("enable_thinking", "date_string") if k in opts} or None
        want = reference(tmpl, msgs, bos, opts.get("add_generation_prompt", True),
                         opts.get("continue_final_message", False), kwargs)
        got = rendered(C, srv, body_of(msgs, opts))
        C.check(got == want, "%s / %s:\n  got  %r\n  want %r" % (family, name, got, want))


def write_template(d, template_file, cfg_update):
    with open(os.path.join(TEMPLATES, template_file), encoding="utf-8") as f:
        text = f.read()
    tc = os.path.join(d, "tokenizer_config.json")
    with open(tc) as f:
        cfg = json.load(f)
    cfg.update(cfg_update)
    cfg["chat_template"] = text
    with open(tc, "w") as f:
        json.dump(cfg, f)
    return text


def llama_tokens(d):
    """The mkmodel tokenizer with three special tokens renamed to Llama-3's."""
    tj = os.path.join(d, "tokenizer.json")
    with open(tj) as f:
        tok = json.load(f)
    ren = {"<|endoftext|>": "<|begin_of_text|>", "<|im_start|>": "<|start_header_id|>", "<|im_end|>": "<|eot_id|>"}
    for a in tok["added_tokens"]:
        if a["content"] in ren:
            old = a["content"]
            a["content"] = ren[old]
            v = tok["model"]["vocab"]
            if old in v:
                v[ren[old]] = v.pop(old)
    with open(tj, "w") as f:
        json.dump(tok, f)


def test_qwen3(C, binary, tmp, env):
    d = mkmodel(C, binary, os.path.join(tmp, "qwen3"))
    text = write_template(d, "qwen3.jinja", {})
    tmpl = env.from_string(text)
    srv = Server(C, binary, d)
    try:
        run_table(C, srv, tmpl, "", COMMON + QWEN3_ONLY, "qwen3")
        # chat completions feed the model what /tokenize renders, chat_template_kwargs included
        msgs = [U1]
        body = {"messages": msgs, "max_tokens": 2, "temperature": 0, "return_token_ids": True,
                "chat_template_kwargs": {"enable_thinking": False}}
        r = post(srv, "/v1/chat/completions", body)
        t = post(srv, "/tokenize", body_of(msgs, {"enable_thinking": False}))
        C.check(r.status == 200 and t.status == 200 and r.json.get("prompt_token_ids") == t.json["tokens"],
                "chat completions prompt != /tokenize with enable_thinking false: %r / %r" % (r, t))
        # request validation (vLLM's field names; param names the field)
        for what, b, param in [
            ("both continue and generation prompt", {"messages": msgs, "continue_final_message": True}, "continue_final_message"),
            ("enable_thinking not a boolean", {"messages": msgs, "chat_template_kwargs": {"enable_thinking": "no"}},
             "chat_template_kwargs"),
            ("chat_template_kwargs not an object", {"messages": msgs, "chat_template_kwargs": [1]}, "chat_template_kwargs"),
            ("continue_final_message not a boolean", {"messages": msgs, "continue_final_message": 1}, "continue_final_message"),
            ("final message missing from rendering", {"messages": [U1, {"role": "assistant", "content": "<think>a</think>"}],
                                                     "add_generation_prompt": False, "continue_final_message": True},
             "continue_final_message"),
            ("tool_calls arguments not a string", {"messages": [U1, {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "f", "arguments": {"x": 1}}}]}]}, "messages"),
            ("tool_calls arguments not JSON", {"messages": [U1, {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "f", "arguments": "{x: 1}"}}]}]}, "messages"),
            ("tools", {"messages": msgs, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ]:
            for path in ("/tokenize", "/v1/chat/completions"):
                r = post(srv, path, b)
                C.check(r.status == 400 and r.json and r.json.get("error", {}).get("param") == param,
                        "%s %s: want 400 param %s, got %r" % (path, what, param, r))
    finally:
        rc, _ = srv.stop()
        C.check(rc == 0, "qwen3 server exit %r" % (rc,))


def test_llama31(C, binary, tmp, env):
    d = mkmodel(C, binary, os.path.join(tmp, "llama31"))
    llama_tokens(d)
    text = write_template(d, "llama31.jinja", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                                               "pad_token": None})
    tmpl = env.from_string(text)
    srv = Server(C, binary, d)
    try:
        run_table(C, srv, tmpl, "<|begin_of_text|>", COMMON + [
            ("date_string", [SYS, U1], {"date_string": "03 Dec 2026"}),
            ("enable_thinking is no variable of this template", [U1], {"enable_thinking": False})], "llama31")
        # the template raises on more than one call
        r = post(srv, "/tokenize", {"messages": [U1, {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "f", "arguments": "{}"}}, {"function": {"name": "g", "arguments": "{}"}}]}]})
        C.check(r.status == 400 and r.json["error"]["param"] == "messages", "llama31 two tool_calls refused: %r" % r)
    finally:
        rc, _ = srv.stop()
        C.check(rc == 0, "llama31 server exit %r" % (rc,))


def main():
    C = Checker("chat_templates")
    if jinja2 is None:
        print("SKIP: jinja2 is not installed (Debian: apt-get install python3-jinja2); the chat templates "
              "were not compared")
        return 77  # ctest SKIP_RETURN_CODE: reported as skipped, not as passed
    binary = gs_bin(C)
    tmp = scratch("chat_templates")
    env = jinja_env()
    try:
        test_qwen3(C, binary, tmp, env)
        test_llama31(C, binary, tmp, env)
    finally:
        _kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
