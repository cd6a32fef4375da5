"""Chat templates in the styles of common model families, written for these
tests (not copied from any model): each uses the Jinja idioms its family's
templates rely on (slicing off the system message, ``namespace`` counters,
``raise_exception`` on bad role order, ``loop.first``/``loop.last``,
``trim``, ``tojson`` of tools, string methods on content, ``selectattr``),
so the bounded sandbox is checked to render real-world constructs unchanged.
"""

from __future__ import annotations

LLAMA3_STYLE = """
{{- bos_token }}
{%- if messages and messages[0]['role'] == 'system' %}
    {%- set system_text = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_text = '' %}
{%- endif %}
{%- if tools is not none or system_text %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}
{%- if tools is not none %}
{{- 'Tools you may call:\\n' }}
{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n\\n' }}{%- endfor %}
{%- endif %}
{{- system_text + '<|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
{{- message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

GEMMA_STYLE = """
{{- bos_token }}
{%- if messages and messages[0]['role'] == 'system' %}
    {%- set first_prefix = messages[0]['content'] ~ '\\n\\n' %}
    {%- set rest = messages[1:] %}
{%- else %}
    {%- set first_prefix = '' %}
    {%- set rest = messages %}
{%- endif %}
{%- for message in rest %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('roles must alternate user/assistant/user/...') }}
    {%- endif %}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}
{{- '<start_of_turn>' ~ role ~ '\\n' ~ (first_prefix if loop.first else '') }}
{{- message['content'] | trim }}<end_of_turn>
{% endfor %}
{%- if add_generation_prompt %}<start_of_turn>model
{% endif %}
"""

MISTRAL_STYLE = """
{%- if messages and messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- set ns = namespace(users=0) %}
{%- for m in loop_messages | selectattr('role', 'equalto', 'user') %}
    {%- set ns.users = ns.users + 1 %}
{%- endfor %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, roles must alternate') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.last and system_message is defined %}
            {{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'] + '[/INST]' }}
        {%- endif %}
    {%- else %}
        {{- ' ' + message['content'] | trim + eos_token }}
    {%- endif %}
{%- endfor %}
{{- '' if ns.users else '' }}
"""

QWEN2_STYLE = """
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}
    {%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
    {{- '\\n\\n# Tools\\n\\n<tools>' }}
    {%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
    {{- '\\n</tools><|im_end|>\\n' }}
{%- elif messages and messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(last_query=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if message.role == 'user' and ns.last_query == messages|length - 1 %}
        {%- set ns.last_query = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- if '</think>' in content %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- for call in message.tool_calls or [] %}
            {%- set f = call.function if call.function is defined else call %}
            {{- '\\n<tool_call>\\n{"name": "' + f.name + '", "arguments": ' }}
            {{- f.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

FAMILIES = {
    "llama3": LLAMA3_STYLE,
    "gemma": GEMMA_STYLE,
    "mistral": MISTRAL_STYLE,
    "qwen2": QWEN2_STYLE,
}
