#!/usr/bin/env python3
"""Generates tests/golden/chat_templates/render.json, the golden file of the C++ chat-template engine
(include/levanter/data/jinja.hpp), from Jinja2 itself.

Every expected text comes from rendering with the environment `transformers` builds for `apply_chat_template`
(src/transformers/utils/chat_template_utils.py, `_compile_jinja_template`):

* `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with the `loopcontrols` extension and the
  `{% generation %}` block extension (its body renders as is; the extension records where the body landed);
* a `tojson` filter replaced by `json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...)`;
* globals `raise_exception(message)` (raises `jinja2.exceptions.TemplateError(message)`) and `strftime_now(format)`.

The one deliberate difference: `strftime_now` reads the fixed clock FIXED_NOW instead of the wall clock, so the file
is reproducible; the C++ test passes the same time to the engine.

Templates are rendered with the variables `transformers` passes: `messages`, `tools` (None unless given),
`documents` (None), `add_generation_prompt`, the tokenizer's special tokens, and any extra keyword arguments.

Usage: python gen_chat_template_golden.py [--out tests/golden/chat_templates/render.json]
Requirements: tests/oracle/requirements-jinja.txt.
"""

import argparse
import datetime
import json
import os

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_NOW = datetime.datetime(2024, 7, 26, 9, 5, 3)


# ---- The environment -----------------------------------------------------------------------------------------------


class GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}body{% endgeneration %}`: renders body; while a span list is attached, appends the
    [start, end) character range the body occupies in the output streamed so far."""

    tags = {"generation"}

    def __init__(self, environment):
        super().__init__(environment)
        self.streamed = None
        self.spans = None

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_generation")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_generation(self, caller):
        text = caller()
        if self.spans is not None:
            start = sum(len(piece) for piece in self.streamed)
            self.spans.append((start, start + len(text)))
        return text


def make_environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_environment()


def render(template_text, context):
    """Renders like transformers: streams the output and records the generation spans. Returns the golden entry."""
    try:
        template = ENV.from_string(template_text)
    except Exception as e:  # noqa: BLE001 - every failure is recorded
        return {"error": True, "phase": "parse", "error_type": type(e).__name__, "message": str(e)}
    ext = next(x for x in ENV.extensions.values() if isinstance(x, GenerationBlock))
    streamed, spans = [], []
    ext.streamed, ext.spans = streamed, spans
    try:
        for piece in template.generate(**context):
            streamed.append(piece)
    except Exception as e:  # noqa: BLE001
        return {"error": True, "phase": "render", "error_type": type(e).__name__, "message": str(e)}
    finally:
        ext.streamed, ext.spans = None, None
    out = "".join(streamed)
    entry = {"output": out}
    if spans:
        entry["spans"] = [list(s) for s in spans]
        entry["byte_spans"] = [[len(out[:a].encode()), len(out[:b].encode())] for a, b in spans]
    return entry


# ---- Real chat templates (data: the exact texts, with where each was read) -----------------------------------------

TEMPLATES = {
    'llama3.1': {
        "model": 'meta-llama/Llama-3.1-8B-Instruct',
        "source": 'ye-NX/llama.cpp models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja @ 1eeb523c3e0c7ffbd59469f5463dcbdecba3535e (fork of ggml-org/llama.cpp)',
        "text": (
            '{{- bos_token }}\n'
            '{%- if custom_tools is defined %}\n'
            '    {%- set tools = custom_tools %}\n'
            '{%- endif %}\n'
            '{%- if not tools_in_user_message is defined %}\n'
            '    {%- set tools_in_user_message = true %}\n'
            '{%- endif %}\n'
            '{%- if not date_string is defined %}\n'
            '    {%- set date_string = "26 Jul 2024" %}\n'
            '{%- endif %}\n'
            '{%- if not tools is defined %}\n'
            '    {%- set tools = none %}\n'
            '{%- endif %}\n'
            '\n'
            '{#- This block extracts the system message, so we can slot it into the right place. #}\n'
            "{%- if messages[0]['role'] == 'system' %}\n"
            "    {%- set system_message = messages[0]['content']|trim %}\n"
            '    {%- set messages = messages[1:] %}\n'
            '{%- else %}\n'
            '    {%- set system_message = "" %}\n'
            '{%- endif %}\n'
            '\n'
            '{#- System message + builtin tools #}\n'
            '{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}\n'
            '{%- if builtin_tools is defined or tools is not none %}\n'
            '    {{- "Environment: ipython\\n" }}\n'
            '{%- endif %}\n'
            '{%- if builtin_tools is defined %}\n'
            '    {{- "Tools: " + builtin_tools | reject(\'equalto\', \'code_interpreter\') | join(", ") + "\\n\\n"}}\n'
            '{%- endif %}\n'
            '{{- "Cutting Knowledge Date: December 2023\\n" }}\n'
            '{{- "Today Date: " + date_string + "\\n\\n" }}\n'
            '{%- if tools is not none and not tools_in_user_message %}\n'
            '    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}\n'
            '    {{- \'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\' }}\n'
            '    {{- "Do not use variables.\\n\\n" }}\n'
            '    {%- for t in tools %}\n'
            '        {{- t | tojson(indent=4) }}\n'
            '        {{- "\\n\\n" }}\n'
            '    {%- endfor %}\n'
            '{%- endif %}\n'
            '{{- system_message }}\n'
            '{{- "<|eot_id|>" }}\n'
            '\n'
            '{#- Custom tools are passed in a user message with some extra guidance #}\n'
            '{%- if tools_in_user_message and not tools is none %}\n'
            '    {#- Extract the first user message so we can plug it in here #}\n'
            '    {%- if messages | length != 0 %}\n'
            "        {%- set first_user_message = messages[0]['content']|trim %}\n"
            '        {%- set messages = messages[1:] %}\n'
            '    {%- else %}\n'
            '        {{- raise_exception("Cannot put tools in the first user message when there\'s no first user message!") }}\n'
            '{%- endif %}\n'
            "    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n"
            '    {{- "Given the following functions, please respond with a JSON for a function call " }}\n'
            '    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}\n'
            '    {{- \'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\' }}\n'
            '    {{- "Do not use variables.\\n\\n" }}\n'
            '    {%- for t in tools %}\n'
            '        {{- t | tojson(indent=4) }}\n'
            '        {{- "\\n\\n" }}\n'
            '    {%- endfor %}\n'
            '    {{- first_user_message + "<|eot_id|>"}}\n'
            '{%- endif %}\n'
            '\n'
            '{%- for message in messages %}\n'
            "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n"
            "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n"
            "    {%- elif 'tool_calls' in message %}\n"
            '        {%- if not message.tool_calls|length == 1 %}\n'
            '            {{- raise_exception("This model only supports single tool-calls at once!") }}\n'
            '        {%- endif %}\n'
            '        {%- set tool_call = message.tool_calls[0].function %}\n'
            '        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}\n'
            "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
            '            {{- "<|python_tag|>" + tool_call.name + ".call(" }}\n'
            '            {%- for arg_name, arg_val in tool_call.arguments | items %}\n'
            '                {{- arg_name + \'="\' + arg_val + \'"\' }}\n'
            '                {%- if not loop.last %}\n'
            '                    {{- ", " }}\n'
            '                {%- endif %}\n'
            '                {%- endfor %}\n'
            '            {{- ")" }}\n'
            '        {%- else  %}\n'
            "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
            '            {{- \'{"name": "\' + tool_call.name + \'", \' }}\n'
            '            {{- \'"parameters": \' }}\n'
            '            {{- tool_call.arguments | tojson }}\n'
            '            {{- "}" }}\n'
            '        {%- endif %}\n'
            '        {%- if builtin_tools is defined %}\n'
            "            {#- This means we're in ipython mode #}\n"
            '            {{- "<|eom_id|>" }}\n'
            '        {%- else %}\n'
            '            {{- "<|eot_id|>" }}\n'
            '        {%- endif %}\n'
            '    {%- elif message.role == "tool" or message.role == "ipython" %}\n'
            '        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}\n'
            '        {%- if message.content is mapping or message.content is iterable %}\n'
            '            {{- message.content | tojson }}\n'
            '        {%- else %}\n'
            '            {{- message.content }}\n'
            '        {%- endif %}\n'
            '        {{- "<|eot_id|>" }}\n'
            '    {%- endif %}\n'
            '{%- endfor %}\n'
            '{%- if add_generation_prompt %}\n'
            "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
            '{%- endif %}\n'
        ),
    },
    'llama3.2': {
        "model": 'meta-llama/Llama-3.2-3B-Instruct',
        "source": 'ye-NX/llama.cpp models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja @ 1eeb523c3e0c7ffbd59469f5463dcbdecba3535e',
        "text": (
            '{{- bos_token }}\n'
            '{%- if custom_tools is defined %}\n'
            '    {%- set tools = custom_tools %}\n'
            '{%- endif %}\n'
            '{%- if not tools_in_user_message is defined %}\n'
            '    {%- set tools_in_user_message = true %}\n'
            '{%- endif %}\n'
            '{%- if not date_string is defined %}\n'
            '    {%- if strftime_now is defined %}\n'
            '        {%- set date_string = strftime_now("%d %b %Y") %}\n'
            '    {%- else %}\n'
            '        {%- set date_string = "26 Jul 2024" %}\n'
            '    {%- endif %}\n'
            '{%- endif %}\n'
            '{%- if not tools is defined %}\n'
            '    {%- set tools = none %}\n'
            '{%- endif %}\n'
            '\n'
            '{#- This block extracts the system message, so we can slot it into the right place. #}\n'
            "{%- if messages[0]['role'] == 'system' %}\n"
            "    {%- set system_message = messages[0]['content']|trim %}\n"
            '    {%- set messages = messages[1:] %}\n'
            '{%- else %}\n'
            '    {%- set system_message = "" %}\n'
            '{%- endif %}\n'
            '\n'
            '{#- System message #}\n'
            '{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}\n'
            '{%- if tools is not none %}\n'
            '    {{- "Environment: ipython\\n" }}\n'
            '{%- endif %}\n'
            '{{- "Cutting Knowledge Date: December 2023\\n" }}\n'
            '{{- "Today Date: " + date_string + "\\n\\n" }}\n'
            '{%- if tools is not none and not tools_in_user_message %}\n'
            '    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}\n'
            '    {{- \'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\' }}\n'
            '    {{- "Do not use variables.\\n\\n" }}\n'
            '    {%- for t in tools %}\n'
            '        {{- t | tojson(indent=4) }}\n'
            '        {{- "\\n\\n" }}\n'
            '    {%- endfor %}\n'
            '{%- endif %}\n'
            '{{- system_message }}\n'
            '{{- "<|eot_id|>" }}\n'
            '\n'
            '{#- Custom tools are passed in a user message with some extra guidance #}\n'
            '{%- if tools_in_user_message and not tools is none %}\n'
            '    {#- Extract the first user message so we can plug it in here #}\n'
            '    {%- if messages | length != 0 %}\n'
            "        {%- set first_user_message = messages[0]['content']|trim %}\n"
            '        {%- set messages = messages[1:] %}\n'
            '    {%- else %}\n'
            '        {{- raise_exception("Cannot put tools in the first user message when there\'s no first user message!") }}\n'
            '{%- endif %}\n'
            "    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n"
            '    {{- "Given the following functions, please respond with a JSON for a function call " }}\n'
            '    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}\n'
            '    {{- \'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\' }}\n'
            '    {{- "Do not use variables.\\n\\n" }}\n'
            '    {%- for t in tools %}\n'
            '        {{- t | tojson(indent=4) }}\n'
            '        {{- "\\n\\n" }}\n'
            '    {%- endfor %}\n'
            '    {{- first_user_message + "<|eot_id|>"}}\n'
            '{%- endif %}\n'
            '\n'
            '{%- for message in messages %}\n'
            "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n"
            "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n"
            "    {%- elif 'tool_calls' in message %}\n"
            '        {%- if not message.tool_calls|length == 1 %}\n'
            '            {{- raise_exception("This model only supports single tool-calls at once!") }}\n'
            '        {%- endif %}\n'
            '        {%- set tool_call = message.tool_calls[0].function %}\n'
            "        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
            '        {{- \'{"name": "\' + tool_call.name + \'", \' }}\n'
            '        {{- \'"parameters": \' }}\n'
            '        {{- tool_call.arguments | tojson }}\n'
            '        {{- "}" }}\n'
            '        {{- "<|eot_id|>" }}\n'
            '    {%- elif message.role == "tool" or message.role == "ipython" %}\n'
            '        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}\n'
            '        {%- if message.content is mapping or message.content is iterable %}\n'
            '            {{- message.content | tojson }}\n'
            '        {%- else %}\n'
            '            {{- message.content }}\n'
            '        {%- endif %}\n'
            '        {{- "<|eot_id|>" }}\n'
            '    {%- endif %}\n'
            '{%- endfor %}\n'
            '{%- if add_generation_prompt %}\n'
            "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
            '{%- endif %}\n'
        ),
    },
    'qwen2.5': {
        "model": 'Qwen/Qwen2.5-7B-Instruct',
        "source": 'ye-NX/llama.cpp models/templates/Qwen-Qwen2.5-7B-Instruct.jinja @ 1eeb523c3e0c7ffbd59469f5463dcbdecba3535e',
        "text": (
            '{%- if tools %}\n'
            "    {{- '<|im_start|>system\\n' }}\n"
            "    {%- if messages[0]['role'] == 'system' %}\n"
            "        {{- messages[0]['content'] }}\n"
            '    {%- else %}\n'
            "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
            '    {%- endif %}\n'
            '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
            '    {%- for tool in tools %}\n'
            '        {{- "\\n" }}\n'
            '        {{- tool | tojson }}\n'
            '    {%- endfor %}\n'
            '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
            '{%- else %}\n'
            "    {%- if messages[0]['role'] == 'system' %}\n"
            "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
            '    {%- else %}\n'
            "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
            '    {%- endif %}\n'
            '{%- endif %}\n'
            '{%- for message in messages %}\n'
            '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}\n'
            "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
            '    {%- elif message.role == "assistant" %}\n'
            "        {{- '<|im_start|>' + message.role }}\n"
            '        {%- if message.content %}\n'
            "            {{- '\\n' + message.content }}\n"
            '        {%- endif %}\n'
            '        {%- for tool_call in message.tool_calls %}\n'
            '            {%- if tool_call.function is defined %}\n'
            '                {%- set tool_call = tool_call.function %}\n'
            '            {%- endif %}\n'
            '            {{- \'\\n<tool_call>\\n{"name": "\' }}\n'
            '            {{- tool_call.name }}\n'
            '            {{- \'", "arguments": \' }}\n'
            '            {{- tool_call.arguments | tojson }}\n'
            "            {{- '}\\n</tool_call>' }}\n"
            '        {%- endfor %}\n'
            "        {{- '<|im_end|>\\n' }}\n"
            '    {%- elif message.role == "tool" %}\n'
            '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
            "            {{- '<|im_start|>user' }}\n"
            '        {%- endif %}\n'
            "        {{- '\\n<tool_response>\\n' }}\n"
            '        {{- message.content }}\n'
            "        {{- '\\n</tool_response>' }}\n"
            '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
            "            {{- '<|im_end|>\\n' }}\n"
            '        {%- endif %}\n'
            '    {%- endif %}\n'
            '{%- endfor %}\n'
            '{%- if add_generation_prompt %}\n'
            "    {{- '<|im_start|>assistant\\n' }}\n"
            '{%- endif %}\n'
        ),
    },
    'qwen3': {
        "model": 'Qwen/Qwen3-0.6B',
        "source": 'ye-NX/llama.cpp models/templates/Qwen-Qwen3-0.6B.jinja @ 1eeb523c3e0c7ffbd59469f5463dcbdecba3535e',
        "text": (
            '{%- if tools %}\n'
            "    {{- '<|im_start|>system\\n' }}\n"
            "    {%- if messages[0].role == 'system' %}\n"
            "        {{- messages[0].content + '\\n\\n' }}\n"
            '    {%- endif %}\n'
            '    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
            '    {%- for tool in tools %}\n'
            '        {{- "\\n" }}\n'
            '        {{- tool | tojson }}\n'
            '    {%- endfor %}\n'
            '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
            '{%- else %}\n'
            "    {%- if messages[0].role == 'system' %}\n"
            "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
            '    {%- endif %}\n'
            '{%- endif %}\n'
            '{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n'
            '{%- for message in messages[::-1] %}\n'
            '    {%- set index = (messages|length - 1) - loop.index0 %}\n'
            '    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith(\'<tool_response>\') and message.content.endswith(\'</tool_response>\')) %}\n'
            '        {%- set ns.multi_step_tool = false %}\n'
            '        {%- set ns.last_query_index = index %}\n'
            '    {%- endif %}\n'
            '{%- endfor %}\n'
            '{%- for message in messages %}\n'
            '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}\n'
            "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
            '    {%- elif message.role == "assistant" %}\n'
            '        {%- set content = message.content %}\n'
            "        {%- set reasoning_content = '' %}\n"
            '        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}\n'
            '            {%- set reasoning_content = message.reasoning_content %}\n'
            '        {%- else %}\n'
            "            {%- if '</think>' in message.content %}\n"
            "                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n"
            "                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n"
            '            {%- endif %}\n'
            '        {%- endif %}\n'
            '        {%- if loop.index0 > ns.last_query_index %}\n'
            '            {%- if loop.last or (not loop.last and reasoning_content) %}\n'
            "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
            '            {%- else %}\n'
            "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
            '            {%- endif %}\n'
            '        {%- else %}\n'
            "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
            '        {%- endif %}\n'
            '        {%- if message.tool_calls %}\n'
            '            {%- for tool_call in message.tool_calls %}\n'
            '                {%- if (loop.first and content) or (not loop.first) %}\n'
            "                    {{- '\\n' }}\n"
            '                {%- endif %}\n'
            '                {%- if tool_call.function %}\n'
            '                    {%- set tool_call = tool_call.function %}\n'
            '                {%- endif %}\n'
            '                {{- \'<tool_call>\\n{"name": "\' }}\n'
            '                {{- tool_call.name }}\n'
            '                {{- \'", "arguments": \' }}\n'
            '                {%- if tool_call.arguments is string %}\n'
            '                    {{- tool_call.arguments }}\n'
            '                {%- else %}\n'
            '                    {{- tool_call.arguments | tojson }}\n'
            '                {%- endif %}\n'
            "                {{- '}\\n</tool_call>' }}\n"
            '            {%- endfor %}\n'
            '        {%- endif %}\n'
            "        {{- '<|im_end|>\\n' }}\n"
            '    {%- elif message.role == "tool" %}\n'
            '        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}\n'
            "            {{- '<|im_start|>user' }}\n"
            '        {%- endif %}\n'
            "        {{- '\\n<tool_response>\\n' }}\n"
            '        {{- message.content }}\n'
            "        {{- '\\n</tool_response>' }}\n"
            '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
            "            {{- '<|im_end|>\\n' }}\n"
            '        {%- endif %}\n'
            '    {%- endif %}\n'
            '{%- endfor %}\n'
            '{%- if add_generation_prompt %}\n'
            "    {{- '<|im_start|>assistant\\n' }}\n"
            '    {%- if enable_thinking is defined and enable_thinking is false %}\n'
            "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
            '    {%- endif %}\n'
            '{%- endif %}'
        ),
    },
    'mistral-v0.1': {
        "model": 'mistralai/Mistral-7B-Instruct-v0.1/v0.2 (pre-v1, no system prompt)',
        "source": 'ye-NX/llama.cpp tests/test-chat-template.cpp line 62 @ 1eeb523c3e0c7ffbd59469f5463dcbdecba3535e',
        "text": (
            "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
        ),
    },
    'mistral-v1': {
        "model": "mistralai/Mistral-7B-Instruct-v0.2 ('v1' template with a system prompt)",
        "source": 'ye-NX/llama.cpp tests/test-chat-template.cpp line 222 @ 1eeb523c3e0c7ffbd59469f5463dcbdecba3535e',
        "text": (
            "{%- if messages[0]['role'] == 'system' %}\n"
            "    {%- set system_message = messages[0]['content'] %}\n"
            '    {%- set loop_messages = messages[1:] %}\n'
            '{%- else %}\n'
            '    {%- set loop_messages = messages %}\n'
            '{%- endif %}\n'
            '\n'
            '{{- bos_token }}\n'
            '{%- for message in loop_messages %}\n'
            "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
            "        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}\n"
            '    {%- endif %}\n'
            "    {%- if message['role'] == 'user' %}\n"
            '        {%- if loop.first and system_message is defined %}\n'
            "            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n"
            '        {%- else %}\n'
            "            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n"
            '        {%- endif %}\n'
            "    {%- elif message['role'] == 'assistant' %}\n"
            "        {{- ' ' + message['content'] + eos_token}}\n"
            '    {%- else %}\n'
            "        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}\n"
            '    {%- endif %}\n'
            '{%- endfor %}\n'
        ),
    },
    'mistral-nemo': {
        "model": 'mistralai/Mistral-Nemo-Instruct-2407 (v3-tekken, tools)',
        "source": 'ye-NX/llama.cpp models/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja @ 1eeb523c3e0c7ffbd59469f5463dcbdecba3535e',
        "text": (
            '{%- if messages[0]["role"] == "system" %}\n'
            '    {%- set system_message = messages[0]["content"] %}\n'
            '    {%- set loop_messages = messages[1:] %}\n'
            '{%- else %}\n'
            '    {%- set loop_messages = messages %}\n'
            '{%- endif %}\n'
            '{%- if not tools is defined %}\n'
            '    {%- set tools = none %}\n'
            '{%- endif %}\n'
            '{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}\n'
            '\n'
            '{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}\n'
            '{%- set ns = namespace() %}\n'
            '{%- set ns.index = 0 %}\n'
            '{%- for message in loop_messages %}\n'
            '    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}\n'
            '        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}\n'
            '            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}\n'
            '        {%- endif %}\n'
            '        {%- set ns.index = ns.index + 1 %}\n'
            '    {%- endif %}\n'
            '{%- endfor %}\n'
            '\n'
            '{{- bos_token }}\n'
            '{%- for message in loop_messages %}\n'
            '    {%- if message["role"] == "user" %}\n'
            '        {%- if tools is not none and (message == user_messages[-1]) %}\n'
            '            {{- "[AVAILABLE_TOOLS][" }}\n'
            '            {%- for tool in tools %}\n'
            '                {%- set tool = tool.function %}\n'
            '                {{- \'{"type": "function", "function": {\' }}\n'
            '                {%- for key, val in tool.items() if key != "return" %}\n'
            '                    {%- if val is string %}\n'
            '                        {{- \'"\' + key + \'": "\' + val + \'"\' }}\n'
            '                    {%- else %}\n'
            '                        {{- \'"\' + key + \'": \' + val|tojson }}\n'
            '                    {%- endif %}\n'
            '                    {%- if not loop.last %}\n'
            '                        {{- ", " }}\n'
            '                    {%- endif %}\n'
            '                {%- endfor %}\n'
            '                {{- "}}" }}\n'
            '                {%- if not loop.last %}\n'
            '                    {{- ", " }}\n'
            '                {%- else %}\n'
            '                    {{- "]" }}\n'
            '                {%- endif %}\n'
            '            {%- endfor %}\n'
            '            {{- "[/AVAILABLE_TOOLS]" }}\n'
            '            {%- endif %}\n'
            '        {%- if loop.last and system_message is defined %}\n'
            '            {{- "[INST]" + system_message + "\\n\\n" + message["content"] + "[/INST]" }}\n'
            '        {%- else %}\n'
            '            {{- "[INST]" + message["content"] + "[/INST]" }}\n'
            '        {%- endif %}\n'
            '    {%- elif (message.tool_calls is defined and message.tool_calls is not none) %}\n'
            '        {{- "[TOOL_CALLS][" }}\n'
            '        {%- for tool_call in message.tool_calls %}\n'
            '            {%- set out = tool_call.function|tojson %}\n'
            '            {{- out[:-1] }}\n'
            '            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}\n'
            '                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}\n'
            '            {%- endif %}\n'
            '            {{- \', "id": "\' + tool_call.id + \'"}\' }}\n'
            '            {%- if not loop.last %}\n'
            '                {{- ", " }}\n'
            '            {%- else %}\n'
            '                {{- "]" + eos_token }}\n'
            '            {%- endif %}\n'
            '        {%- endfor %}\n'
            '    {%- elif message["role"] == "assistant" %}\n'
            '        {{- message["content"] + eos_token}}\n'
            '    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}\n'
            '        {%- if message.content is defined and message.content.content is defined %}\n'
            '            {%- set content = message.content.content %}\n'
            '        {%- else %}\n'
            '            {%- set content = message.content %}\n'
            '        {%- endif %}\n'
            '        {{- \'[TOOL_RESULTS]{"content": \' + content|string + ", " }}\n'
            '        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}\n'
            '            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}\n'
            '        {%- endif %}\n'
            '        {{- \'"call_id": "\' + message.tool_call_id + \'"}[/TOOL_RESULTS]\' }}\n'
            '    {%- else %}\n'
            '        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}\n'
            '    {%- endif %}\n'
            '{%- endfor %}\n'
        ),
    },
    'gemma': {
        "model": 'google/gemma-7b-it',
        "source": 'ye-NX/llama.cpp tests/test-chat-template.cpp line 94 @ 1eeb523c3e0c7ffbd59469f5463dcbdecba3535e',
        "text": (
            "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
        ),
    },
    'gemma2': {
        "model": 'google/gemma-2-2b-it',
        "source": 'ye-NX/llama.cpp models/templates/google-gemma-2-2b-it.jinja @ 1eeb523c3e0c7ffbd59469f5463dcbdecba3535e',
        "text": (
            "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n"
            "' + message['content'] | trim + '<end_of_turn>\n"
            "' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n"
            "'}}{% endif %}"
        ),
    },
    'olmo2': {
        "model": 'allenai/OLMo-2-1124-13B-Instruct',
        "source": 'mauer4/Attention-From-Scratch weights/allenai/OLMo-2-1124-13B-Instruct/tokenizer_config.json @ 7b2eb9540b3955e12c8645aa55cb131d38223f01',
        "text": (
            "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|system|>\n"
            "' + message['content'] + '\n"
            "' }}{% elif message['role'] == 'user' %}{{ '<|user|>\n"
            "' + message['content'] + '\n"
            "' }}{% elif message['role'] == 'assistant' %}{% if not loop.last %}{{ '<|assistant|>\n"
            "'  + message['content'] + eos_token + '\n"
            "' }}{% else %}{{ '<|assistant|>\n"
            "'  + message['content'] + eos_token }}{% endif %}{% endif %}{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\n"
            "' }}{% endif %}{% endfor %}"
        ),
    },
    'tulu3': {
        "model": "allenai/Llama-3.1-Tulu-3-8B (open-instruct 'tulu' template)",
        "source": "allenai/open-instruct open_instruct/dataset_transformation.py CHAT_TEMPLATES['tulu'] @ 29e5ad10525ff5df6c161520aa973be5f695359c",
        "text": (
            "{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|system|>\n"
            "' + message['content'] + '\n"
            "' }}{% elif message['role'] == 'user' %}{{ '<|user|>\n"
            "' + message['content'] + '\n"
            "' }}{% elif message['role'] == 'assistant' %}{% if not loop.last %}{{ '<|assistant|>\n"
            "'  + message['content'] + eos_token + '\n"
            "' }}{% else %}{{ '<|assistant|>\n"
            "'  + message['content'] + eos_token }}{% endif %}{% endif %}{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\n"
            "' }}{% endif %}{% endfor %}"
        ),
    },
}

SPECIAL_TOKENS = {
    "llama3.1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3.2": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "qwen2.5": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "qwen3": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "mistral-v0.1": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "mistral-v1": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "mistral-nemo": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "gemma": {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"},
    "gemma2": {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"},
    "olmo2": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|pad|>"},
    "tulu3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
}

# ---- Conversations ---------------------------------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. \"Paris\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "Multiplies two numbers",
        "parameters": {
            "type": "object",
            "properties": {"x": {"type": "number"}, "y": {"type": "number", "default": 1.5}},
            "required": ["x"],
        },
        "return": {"type": "number"},
    },
}


def tool_call(name, args, call_id="call12345"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


U = lambda c: {"role": "user", "content": c}  # noqa: E731
A = lambda c: {"role": "assistant", "content": c}  # noqa: E731
S = lambda c: {"role": "system", "content": c}  # noqa: E731

CONVERSATIONS = {
    "single_user": [U("Hello!")],
    "system_user": [S("You are a helpful assistant."), U("What is 2+2?")],
    "multi_turn": [U("Hi"), A("Hello! How can I help?"), U("Tell me a joke."), A("Why did the chicken cross the road?"),
                   U("Why?")],
    "system_multi_turn": [S("  Be brief.  \n"), U("Hi"), A("Hello."), U("Bye")],
    "ends_with_assistant": [U("Say hi"), A("Hi!")],
    "empty_content": [U(""), A(""), U("")],
    "unicode": [S("Réponds en français 🇫🇷"), U("Ça va? 日本語 \"quotes\" and \\backslash\\ and\ttab"),
                A("Très bien — 谢谢! 😀"), U("Ünïcödé\nnewline")],
    "whitespace": [U("   padded user   \n\n"), A("\n  padded assistant \n"), U("\tx\t")],
    "tool_call": [U("What's the weather in Paris?"),
                  {"role": "assistant", "content": "", "tool_calls": [tool_call("get_weather", {"city": "Paris", "unit": "celsius"})]},
                  {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temperature\": 22.5, \"sky\": \"clear\"}"},
                  A("It is 22.5 °C and clear in Paris.")],
    "tool_call_system": [S("You can call tools."), U("Compute 6 * 7"),
                         {"role": "assistant", "content": None, "tool_calls": [tool_call("multiply", {"x": 6, "y": 7})]},
                         {"role": "tool", "tool_call_id": "call12345", "content": "42"}],
    "thinking": [U("What is 1+1?"), A("<think>\nOne plus one.\n</think>\n\n2"), U("And 2+2?"),
                 A("<think>\nTwo plus two.\n</think>\n\nIt is 4.")],
    "reasoning_field": [U("Q1"), {"role": "assistant", "content": "A1", "reasoning_content": "think 1"}, U("Q2")],
    "bad_order": [U("one"), U("two")],
    "starts_with_assistant": [A("I start"), U("ok")],
    "empty_messages": [],
}

# (conversation, add_generation_prompt, extra kwargs, tools) per template; every template also gets the plain list.
COMMON = ["single_user", "system_user", "multi_turn", "system_multi_turn", "ends_with_assistant", "empty_content",
          "unicode", "whitespace", "bad_order", "starts_with_assistant", "empty_messages"]
EXTRA = {
    "llama3.1": [("tool_call", {}, [WEATHER_TOOL]), ("system_user", {}, [WEATHER_TOOL, CALC_TOOL]),
                 ("tool_call_system", {"tools_in_user_message": False, "date_string": "15 Mar 2025"}, [CALC_TOOL]),
                 ("single_user", {"date_string": "01 Jan 2025"}, None),
                 ("tool_call", {"builtin_tools": ["brave_search", "wolfram_alpha"]}, None),
                 ("tool_call", {"builtin_tools": ["get_weather", "code_interpreter"]}, None)],
    "llama3.2": [("tool_call", {}, [WEATHER_TOOL]), ("system_user", {"tools_in_user_message": False}, [CALC_TOOL]),
                 ("single_user", {"date_string": "02 Feb 2025"}, None)],
    "qwen2.5": [("tool_call", {}, [WEATHER_TOOL]), ("tool_call_system", {}, [WEATHER_TOOL, CALC_TOOL]),
                ("system_user", {}, [CALC_TOOL])],
    "qwen3": [("tool_call", {}, [WEATHER_TOOL]), ("tool_call_system", {}, [WEATHER_TOOL, CALC_TOOL]),
              ("thinking", {}, None), ("thinking", {"enable_thinking": False}, None),
              ("thinking", {"enable_thinking": True}, None), ("reasoning_field", {}, None),
              ("reasoning_field", {"enable_thinking": False}, None)],
    "mistral-nemo": [("tool_call", {}, [WEATHER_TOOL]), ("tool_call_system", {}, [WEATHER_TOOL, CALC_TOOL])],
}


def conversation_cases():
    cases = []
    for tname, spec in TEMPLATES.items():
        plans = [(c, {}, None) for c in COMMON] + EXTRA.get(tname, [])
        for conv, kwargs, tools in plans:
            for agp in (False, True):
                context = {"messages": CONVERSATIONS[conv], "tools": tools, "documents": None,
                           "add_generation_prompt": agp, **SPECIAL_TOKENS[tname], **kwargs}
                name = f"{tname}/{conv}" + "".join(f"/{k}" for k in kwargs) + ("/tools" if tools else "")
                name += "/gen" if agp else ""
                cases.append({"name": name, "template": tname, "context": context, **render(spec["text"], context)})
    # A bad tool-call id (the Mistral v3 templates check it) and a tool-calling assistant turn without content.
    bad = [U("x"), {"role": "assistant", "content": "", "tool_calls": [tool_call("get_weather", {"city": "X"}, "short")]}]
    for tname in ("mistral-nemo",):
        context = {"messages": bad, "tools": None, "documents": None, "add_generation_prompt": False,
                   **SPECIAL_TOKENS[tname]}
        cases.append({"name": f"{tname}/bad_tool_call_id", "template": tname, "context": context,
                      **render(TEMPLATES[tname]["text"], context)})
    return cases


# ---- Unit cases: one feature each -----------------------------------------------------------------------------------

M = {"a": 1, "b": [1, 2, 3], "s": "Hello World", "n": None, "f": 1.5, "t": True, "d": {"x": "1", "y": 2},
     "msgs": [{"role": "user", "content": "hi", "n": 2}, {"role": "assistant", "content": "yo", "n": 1},
              {"role": "user", "content": "bye", "extra": True, "n": 3}],
     "u": "héllo wörld ÉTÉ", "e": "", "l": [], "words": ["b", "A", "c", "a", "B"]}

UNIT = [
    # text, comments, output
    "plain text", "{{ 'a' }}{# comment #}{{ 'b' }}", "{{ a }} {{ s }} {{ n }} {{ t }} {{ f }} {{ b }} {{ d }}",
    "{{ missing }}|{{ missing is defined }}|{{ missing is undefined }}",
    # whitespace control and trim_blocks / lstrip_blocks
    "a\n{% if true %}\nb\n{% endif %}\nc", "a\n    {% if true %}\n    b\n    {% endif %}\nc",
    "  {{ a }}  \n  {% if t %}x{% endif %}  \n", "a  {%- if true -%}  b  {%- endif -%}  c",
    "a\n{{- 'b' -}}\nc", "a\n  {#- c -#}\n  b", "a\n  {# c #}\n  b", "{% if true %}  \n  x{% endif %}",
    "x  {% if true %}y{% endif %}", "{% for i in b %}\n  {{ i }}\n{% endfor %}\n",
    "{% for i in b %}\n  {{- i }}\n{% endfor %}", "a\n\t {%+ if true %}b{% endif %}", "{% if true +%}\nb{% endif %}",
    "line\n", "line\n\n", "a\r\nb\r\n{% if true %}\r\nc{% endif %}", "  {% raw %}{{ x }}{% endraw %}  ",
    "{% if true %}a{% else %}b{% endif %}\n\n  {{ 'c' }}", "\n{% set x = 1 %}\n{{ x }}\n",
    "{%- if true %}\n\n a{% endif -%}\n\n b", "{% if true %}{% endif %}   \n   {{ a }}", "   {%- if true %}x{% endif %}",
    "a\n   {% for i in b %}{{ i }}{% endfor %}   \nb", "{% macro m() %}\n  x\n{% endmacro %}\n[{{ m() }}]",
    # literals
    "{{ 'single' }} {{ \"double\" }} {{ 'it\\'s' }} {{ \"a\\\"b\" }} {{ 'tab\\tnl\\n' }} {{ '\\u00e9\\x41' }}",
    "{{ 42 }} {{ -7 }} {{ 1_000 }} {{ 0x1f }} {{ 0b101 }} {{ 0o17 }} {{ 3.25 }} {{ 1e3 }} {{ 2.5e-3 }}",
    "{{ true }} {{ True }} {{ false }} {{ False }} {{ none }} {{ None }}",
    "{{ [1, 'a', none, true, 1.0, [2]] }} {{ {'k': 'v', 'n': [1]} }} {{ (1,) }} {{ (1, 2) }} {{ () }}",
    "{{ 'a' 'b' }}", "{{ ['it\\'s', \"q\\\"\", 'back\\\\slash', 'nl\\n'] }}",
    # arithmetic
    "{{ 1 + 2 }} {{ 1 - 2.5 }} {{ 2 * 3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }}",
    "{{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 3 ** 2 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1 / 3 }} {{ 0.1 + 0.2 }}",
    "{{ 1e-5 }} {{ 1e16 }} {{ 1e15 }} {{ 123456789.123 }} {{ 1.0 }} {{ -0.0 }} {{ 2.5e-7 * 2 }} {{ 1e300 * 10 }}",
    "{{ 'ab' * 3 }} {{ 3 * 'x' }} {{ [1] * 3 }} {{ [1] + [2] }} {{ 'a' + 'b' }} {{ 1 ~ 'x' ~ none ~ missing }}",
    "{{ true + 1 }} {{ -true }} {{ -(3) }} {{ +3 }} {{ 10 - 2 - 3 }} {{ 2 * 3 + 4 }} {{ (2 + 3) * 4 }}",
    "{{ 1 / 0 }}", "{{ 'a' + 1 }}", "{{ missing + 1 }}", "{{ 5 // 0 }}", "{{ 5 % 0 }}",
    # comparisons and logic
    "{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 'a' < 'b' }} {{ 2 >= 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ true == 1 }}",
    "{{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }} {{ none == none }} {{ 'a' == 1 }} {{ missing == missing }}",
    "{{ true and false }} {{ true or false }} {{ not true }} {{ 0 or 'x' }} {{ '' and 'y' }} {{ none or [] }}",
    "{{ 'a' in 'cat' }} {{ 2 in b }} {{ 'x' in d }} {{ 'z' not in d }} {{ 5 not in b }} {{ 'q' in missing }}",
    "{{ 'yes' if t else 'no' }} {{ 'yes' if n else 'no' }} [{{ 'x' if false }}] {{ 1 if 0 else 2 if 0 else 3 }}",
    "{{ 1 < 'a' }}", "{{ not missing }} {{ not n }} {{ not l }} {{ not e }} {{ not 0.0 }} {{ not d }}",
    # attribute / subscript / slices
    "{{ d.x }} {{ d['y'] }} {{ msgs[0].role }} {{ msgs[-1]['content'] }} {{ b.1 }} {{ d.missing }}|{{ b[10] }}|",
    "{{ s[0] }} {{ s[-1] }} {{ s[1:4] }} {{ s[::-1] }} {{ s[:-1] }} {{ b[1:] }} {{ b[::2] }} {{ b[::-1] }} {{ b[5:] }}",
    "{{ u[1] }} {{ u[-3:] }} {{ u|length }} {{ u[::-1] }}", "{{ d.missing.x }}", "{{ missing.x }}", "{{ missing[0] }}",
    "{{ n.x }}", "{{ b[::0] }}",
    # if / elif / else
    "{% if a == 2 %}two{% elif a == 1 %}one{% else %}other{% endif %}",
    "{% if missing %}m{% elif n %}n{% else %}else{% endif %}",
    "{% if b %}{% if b|length > 2 %}long{% endif %}{% endif %}",
    # for loops
    "{% for x in b %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
    "{% for x in b %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}",
    "{% for x in b %}{{ loop.cycle('odd', 'even') }} {% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "{% for k in d %}{{ k }}{% endfor %}",
    "{% for x in b if x != 2 %}{{ x }}{{ loop.index }}{{ loop.length }} {% endfor %}",
    "{% for x in l %}x{% else %}empty{% endfor %}", "{% for x in missing %}x{% else %}undef{% endfor %}",
    "{% for x in b %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}",
    "{% for x in b %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for x in b %}{% for y in b %}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %}",
    "{% for c in 'abc' %}{{ c }}-{% endfor %}", "{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}",
    "{% set x = 1 %}{% for i in b %}{{ x }}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}",
    "{% for i in b %}{% if i == 2 %}{{ y }}{% endif %}{% set y = i %}{% endfor %}", "{% for x in 5 %}{% endfor %}",
    "{% for x in n %}{% endfor %}", "{% for m in msgs[::-1] %}{{ m.role }}{{ loop.index0 }} {% endfor %}",
    "{% break %}",
    # set / namespace / block set
    "{% set x = 'v' %}{{ x }}{% set x, y = 1, 2 %}{{ x + y }}",
    "{% set ns = namespace(found=false, n=0) %}{% for m in msgs %}{% if m.role == 'assistant' %}{% set ns.found = true %}{% endif %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.found }} {{ ns.n }}",
    "{% set ns = namespace() %}{% set ns.a = [1] %}{{ ns.a }}", "{% set x %}block {{ a }}{% endset %}[{{ x }}]",
    "{% set x | upper %}shout{% endset %}{{ x }}", "{% set d.x = 1 %}", "{% if true %}{% set inner = 1 %}{% endif %}{{ inner }}",
    "{% set ns = namespace(d) %}{{ ns.x }}{{ ns.y }}",
    # macros
    "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', 'Hi') }} {{ greet(greeting='Yo', name='Cy') }}",
    "{% macro f(x) %}[{{ x }}]{% endmacro %}{{ f() }}{{ f(1) }}",
    "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}",
    "{% set x = 5 %}{% macro g() %}{{ x }}{% endmacro %}{% set x = 6 %}{{ g() }}",
    "{% macro render_list(items) %}{% for i in items %}{{ i }},{% endfor %}{% endmacro %}{{ render_list(b)|trim(',') }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}",
    # generation
    "{% for m in msgs %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}!{% endgeneration %}{% else %}<{{ m.content }}>{% endif %}{% endfor %}",
    "é{% generation %}ü{{ 'ß' }}{% endgeneration %}x\n{% generation %}\nz{% endgeneration %}",
    # tests
    "{{ a is number }} {{ f is number }} {{ t is number }} {{ s is number }} {{ a is integer }} {{ f is float }} {{ t is integer }}",
    "{{ s is string }} {{ d is mapping }} {{ b is mapping }} {{ b is iterable }} {{ s is iterable }} {{ a is iterable }} {{ missing is iterable }}",
    "{{ b is sequence }} {{ s is sequence }} {{ d is sequence }} {{ a is sequence }} {{ n is none }} {{ missing is none }}",
    "{{ t is boolean }} {{ a is boolean }} {{ t is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }}",
    "{{ 3 is odd }} {{ 3 is even }} {{ 4 is divisibleby 2 }} {{ a is equalto 1 }} {{ a is eq 2 }} {{ s is ne 'x' }}",
    "{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 2 is in b }} {{ 3 is gt 2 }} {{ 3 is lt 2 }} {{ 2 is ge 2 }} {{ 2 is le 1 }}",
    "{{ n is not none }} {{ s is not string }} {{ none is sameas none }} {{ greet is defined }} {{ range is callable }}",
    "{{ a is frobnicated }}",
    # filters
    "{{ '  x  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ s|lower }}|{{ s|upper }}|{{ 'hello wORLD-x (y'|title }}|{{ 'hELLO'|capitalize }}",
    "{{ s|length }} {{ b|length }} {{ d|count }} {{ missing|length }} {{ ''|length }}",
    "{{ s|replace('o', '0') }} {{ s|replace('o', '0', 1) }} {{ 'aaa'|replace('', '-') }}",
    "{{ missing|default('dflt') }} {{ e|default('dflt') }} {{ e|default('dflt', true) }} {{ n|d('x') }} {{ n|d('x', true) }} {{ a|default(5) }}",
    "{{ b|join(', ') }} {{ words|join }} {{ msgs|join('|', attribute='role') }} {{ [1, none, 'x']|join('-') }}",
    "{{ b|first }} {{ b|last }} {{ s|first }} {{ l|first }}| {{ 'abc'|last }}",
    "{{ s|list }} {{ d|list }} {{ b|string }} {{ 42|string }} {{ none|string }}",
    "{{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '0x1A'|int(0, 16) }} {{ '2.5'|float }} {{ 'y'|float }} {{ 3|float }}",
    "{{ -3|abs }} {{ (-2.5)|abs }} {{ d|items|list }} {{ missing|items|list }}",
    "{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }} {{ msgs|rejectattr('role', 'eq', 'user')|list|length }}",
    "{{ msgs|selectattr('extra')|list|length }} {{ msgs|selectattr('extra', 'defined')|map(attribute='content')|first }} {{ msgs|rejectattr('extra', 'defined')|list|length }}",
    "{{ msgs|map(attribute='n')|list }} {{ msgs|map(attribute='missing', default='?')|list }} {{ words|map('upper')|list }} {{ ['1', '2']|map('int')|sum }}",
    "{{ [0, 1, '', 'a', none]|select|list }} {{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('even')|list }} {{ b|select('equalto', 2)|list }}",
    "{{ words|unique|list }} {{ words|unique(case_sensitive=true)|list }} {{ [3, 1, 3, 2, 1]|unique|list }}",
    "{{ b|reverse|list }} {{ s|reverse }} {{ words|sort }} {{ words|sort(case_sensitive=true) }} {{ words|sort(reverse=true) }} {{ msgs|sort(attribute='n')|map(attribute='content')|join }}",
    "{{ '<b>&'|safe }} {{ '<a href=\"x\">&\\'</a>'|e }} {{ '<x>'|escape }}",
    "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'a\\nb'|indent('>') }}",
    "{{ 'one two  three'|wordcount }} [{{ 'ab'|center(7) }}] [{{ 'abc'|center(6) }}]",
    "{{ d|dictsort }} {{ {'b': 1, 'A': 2, 'c': 0}|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value') }}",
    "{{ s|frobnicate }}", "{{ b|join(1) }}",
    # tojson
    "{{ d|tojson }} {{ b|tojson }} {{ s|tojson }} {{ n|tojson }} {{ t|tojson }} {{ f|tojson }} {{ 1e-7|tojson }} {{ 10.0|tojson }}",
    "{{ msgs[0]|tojson(indent=2) }}", "{{ {'z': 1, 'a': {'y': [1, {'b': 2}], 'x': []}, 'e': {}}|tojson(indent=4) }}",
    "{{ u|tojson }} {{ 'q\"b\\\\s\\n\\t\\x01\\x7f/'|tojson }} {{ [1, 'é']|tojson(separators=(',', ':')) }}",
    "{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }} {{ [1, [2, []]]|tojson(indent=0) }} {{ {'a': [1, 2]}|tojson(indent='\\t') }}",
    "{{ missing|tojson }}",
    # string methods
    "{{ '  x  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  x  '.lstrip() }}|{{ '  x  '.rstrip() }}|{{ '\\n\\nx\\n'.lstrip('\\n') }}|{{ 'ab\\n'.rstrip('\\n') }}",
    "{{ 'a b  c '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ 'a</think>b</think>c'.split('</think>')[-1] }} {{ ''.split() }} {{ ''.split(',') }}",
    "{{ s.startswith('Hell') }} {{ s.endswith('x') }} {{ s.startswith(('x', 'H')) }} {{ s.upper() }} {{ s.lower() }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }}",
    "{{ s.replace('l', 'L') }} {{ s.replace('l', 'L', 2) }} {{ s.find('o') }} {{ s.find('z') }} {{ s.rfind('o') }} {{ s.count('l') }} {{ u.find('w') }}",
    "{{ ', '.join(['a', 'b']) }} {{ '-'.join('abc') }} {{ 'a\\nb\\r\\nc'.splitlines() }} {{ 'a,b,c'.rsplit(',', 1) }}",
    "{{ '123'.isdigit() }} {{ 'abc'.isalpha() }} {{ 'a1'.isalnum() }} {{ ' '.isspace() }} {{ 'ab'.islower() }} {{ 'AB'.isupper() }}",
    "{{ u.upper() }} {{ u.lower() }} {{ u|title }} {{ u.title() }}",
    "{{ ', '.join([1, 2]) }}",
    # dict / list methods
    "{{ d.items()|list }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.get('x') }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }}",
    "{{ b.index(2) }} {{ b.count(2) }}", "{{ b.append(4) }}", "{{ d.update({'a': 1}) }}", "{{ d.pop('x') }}",
    # globals
    "{{ range(3)|list }} {{ range(1, 4)|list }} {{ range(10, 0, -3)|list }} {{ range(0)|list }}",
    "{{ range(200000)|length }}", "{{ raise_exception('custom failure: ' ~ a) }}",
    "{% if b|length > 2 %}{{ raise_exception('too many') }}{% endif %}after", "{{ strftime_now('%Y-%m-%d %H:%M:%S %a %b %d') }}",
    "{{ dict(a=1, b='x') }} {{ namespace(a=1).a }}",
    # errors at parse time
    "{% if true %}unterminated", "{% for x in b %}", "{{ 'unterminated }}", "{{ 1 + }}", "{% endif %}",
    "{% frobnicate %}", "{% include 'x.html' %}", "{% extends 'base.html' %}", "{% import 'm' as m %}", "{{ (1 }}",
    "{# unterminated comment", "{% macro %}{% endmacro %}", "{{ a | }}", "line1\nline2\n{{ x|nosuchfilter }}",
]

CTX_OVERRIDES = {}


def unit_cases():
    cases = []
    for i, text in enumerate(UNIT):
        context = CTX_OVERRIDES.get(text, M)
        cases.append({"name": f"unit{i:03d}", "template": text, "context": context, **render(text, context)})
    return cases


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(here, "..", "golden", "chat_templates", "render.json"))
    args = parser.parse_args()
    golden = {
        "generator": "tests/oracle/gen_chat_template_golden.py",
        "jinja2_version": jinja2.__version__,
        "fixed_now": FIXED_NOW.isoformat(),
        "templates": TEMPLATES,
        "conversations": conversation_cases(),
        "unit": unit_cases(),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(1 for c in golden["conversations"] + golden["unit"] if c.get("error"))
    print(f"wrote {args.out}: {len(golden['conversations'])} conversations, {len(golden['unit'])} unit cases, "
          f"{n_err} expected errors")


if __name__ == "__main__":
    main()
