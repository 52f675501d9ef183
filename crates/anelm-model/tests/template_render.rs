//! Chat templates rendered as transformers / llama.cpp render them: the real
//! SmolLM2 and Qwen3 templates, a thinking switch, the Jinja features HF
//! templates rely on, and the errors.

use anelm_model::chat_template::{ChatMessage, ChatTemplate, TemplateError};
use serde_json::{Map, Value, json};

/// `tokenizer.chat_template` of SmolLM2-135M-Instruct (from its GGUF metadata).
const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// The Qwen3 chat template as embedded in Qwen3 GGUF files (text as logged by
/// llama-server; test data only).
const QWEN3: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- set tool_start = "<tool_response>" %}
    {%- set tool_start_length = tool_start|length %}
    {%- set start_of_message = message.content[:tool_start_length] %}
    {%- set tool_end = "</tool_response>" %}
    {%- set tool_end_length = tool_end|length %}
    {%- set start_pos = (message.content|length) - tool_end_length %}
    {%- if start_pos < 0 %}
        {%- set start_pos = 0 %}
    {%- endif %}
    {%- set end_of_message = message.content[start_pos:] %}
    {%- if ns.multi_step_tool and message.role == "user" and not(start_of_message == tool_start and end_of_message == tool_end) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = (message.content.split('</think>')|last).lstrip('\n') %}
        {%- set reasoning_content = (message.content.split('</think>')|first).rstrip('\n') %}
        {%- set reasoning_content = (reasoning_content.split('<think>')|last).lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"##;

fn msgs(list: &[(&str, &str)]) -> Vec<ChatMessage> {
    list.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect()
}

fn extra(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

#[test]
fn smollm2_user_only_gets_default_system() {
    let t = ChatTemplate::new(SMOLLM2, Some("<|im_start|>"), Some("<|im_end|>")).unwrap();
    let out = t.render(&msgs(&[("user", "Hi")]), true, &Map::new()).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let no_prompt = t.render(&msgs(&[("user", "Hi")]), false, &Map::new()).unwrap();
    assert!(!no_prompt.ends_with("<|im_start|>assistant\n"));
}

#[test]
fn smollm2_system_and_multi_turn() {
    let t = ChatTemplate::new(SMOLLM2, None, None).unwrap();
    let out = t
        .render(
            &msgs(&[
                ("system", "Be brief."),
                ("user", "2+2?"),
                ("assistant", "4"),
                ("user", "And 3+3?"),
            ]),
            true,
            &Map::new(),
        )
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn smollm2_matches_llama_cpp_chat_prompt() {
    // The llama.cpp fixture's chat prompt is this template's rendering minus the
    // default system turn.
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/llamacpp/smollm2-llamacpp-greedy.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let prompt = fixture["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["prompt"].as_str())
        .find(|p| p.starts_with("<|im_start|>"))
        .unwrap();
    let t = ChatTemplate::new(SMOLLM2, None, None).unwrap();
    let out = t.render(&msgs(&[("user", "What is 2+2?")]), true, &Map::new()).unwrap();
    let system = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";
    assert_eq!(out, format!("{system}{prompt}"));
}

#[test]
fn qwen3_matches_llama_cpp_example_format() {
    let t = ChatTemplate::new(QWEN3, None, Some("<|im_end|>")).unwrap();
    let conv = msgs(&[
        ("system", "You are a helpful assistant"),
        ("user", "Hello"),
        ("assistant", "Hi there"),
        ("user", "How are you?"),
    ]);
    // llama-server's "example_format" for this template.
    let expected = "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(t.render(&conv, true, &Map::new()).unwrap(), expected);
    let off = t
        .render(&conv, true, &extra(json!({"enable_thinking": false})))
        .unwrap();
    assert_eq!(off, format!("{expected}<think>\n\n</think>\n\n"));
    let on = t.render(&conv, true, &extra(json!({"enable_thinking": true}))).unwrap();
    assert_eq!(on, expected);
}

#[test]
fn qwen3_reasoning_kept_only_after_last_query() {
    let t = ChatTemplate::new(QWEN3, None, None).unwrap();
    let history = msgs(&[
        ("user", "Q1"),
        ("assistant", "<think>\nR1\n</think>\n\nA1"),
        ("user", "Q2"),
        ("assistant", "<think>\nR2\n</think>\n\nA2"),
    ]);
    let out = t.render(&history, false, &Map::new()).unwrap();
    assert_eq!(
        out,
        "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\nR2\n</think>\n\nA2<|im_end|>\n"
    );
}

#[test]
fn qwen3_tools_use_python_json() {
    let t = ChatTemplate::new(QWEN3, None, None).unwrap();
    let tools = json!({"tools": [{"function": {"description": "d", "name": "f"}, "type": "function"}]});
    let out = t.render(&msgs(&[("user", "call f")]), true, &extra(tools)).unwrap();
    assert!(
        out.contains(
            "<tools>\n{\"function\": {\"description\": \"d\", \"name\": \"f\"}, \"type\": \"function\"}\n</tools>"
        ),
        "{out}"
    );
    assert!(out.starts_with("<|im_start|>system\n# Tools"));
}

#[test]
fn small_thinking_switch() {
    let src = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% if enable_thinking is defined and not enable_thinking %}<think></think>{% else %}<think>{% endif %}{% endif %}";
    let t = ChatTemplate::new(src, None, None).unwrap();
    let conv = msgs(&[("user", "x")]);
    assert_eq!(t.render(&conv, true, &Map::new()).unwrap(), "[user]x[assistant]<think>");
    assert_eq!(
        t.render(&conv, true, &extra(json!({"enable_thinking": false})))
            .unwrap(),
        "[user]x[assistant]<think></think>"
    );
    assert_eq!(t.render(&conv, false, &Map::new()).unwrap(), "[user]x");
}

#[test]
fn raise_exception_surfaces_the_message() {
    let src = "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{{ m.content }}{% endfor %}";
    let t = ChatTemplate::new(src, None, None).unwrap();
    assert_eq!(
        t.render(&msgs(&[("user", "a"), ("assistant", "b")]), false, &Map::new())
            .unwrap(),
        "ab"
    );
    let err = t
        .render(&msgs(&[("user", "a"), ("user", "b")]), false, &Map::new())
        .unwrap_err();
    match &err {
        TemplateError::Raised(msg) => assert_eq!(
            msg,
            "Conversation roles must alternate user/assistant/user/assistant/..."
        ),
        other => panic!("expected Raised, got {other:?}"),
    }
    assert!(err.to_string().contains("roles must alternate"));
}

#[test]
fn parse_failure_is_a_clear_error() {
    for bad in [
        "{% for m in messages %}{{ m.content }",
        "{% if x %}no end",
        "{{ 'a' + }}",
    ] {
        match ChatTemplate::new(bad, None, None) {
            Err(TemplateError::Parse { message }) => {
                assert!(!message.is_empty());
                let shown = TemplateError::Parse { message }.to_string();
                assert!(shown.contains("does not compile"), "{shown}");
            }
            other => panic!("{bad:?}: expected Parse error, got {other:?}"),
        }
    }
}

#[test]
fn render_failure_is_an_error_not_a_panic() {
    let t = ChatTemplate::new("{{ messages | no_such_filter }}", None, None);
    // minijinja may reject an unknown filter at compile or render time.
    if let Ok(t) = t {
        assert!(matches!(
            t.render(&[], false, &Map::new()),
            Err(TemplateError::Render { .. })
        ));
    }
    let t = ChatTemplate::new("{{ messages[0].content.upper() }}", None, None).unwrap();
    assert!(t.render(&msgs(&[("user", "ab")]), false, &Map::new()).unwrap() == "AB");
    assert!(t.render(&[], false, &Map::new()).is_err());
}

#[test]
fn python_methods_namespace_loop_controls() {
    let src = concat!(
        "{{ '  x  '.strip() }}|{{ 'a,b,c'.split(',') | length }}|",
        "{% if 'abc'.startswith('ab') and 'abc'.endswith('c') %}yes{% endif %}|",
        "{{ 'aXb'.replace('X', '-') }}|{{ '\nq\n'.lstrip('\n').rstrip('\n') }}|",
        "{% set ns = namespace(n=0) %}{% for m in messages %}",
        "{% if m.role == 'system' %}{% continue %}{% endif %}",
        "{% if loop.index > 3 %}{% break %}{% endif %}",
        "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}|",
        "{% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}{{ v }}{% endfor %}|",
        "{{ messages[::-1][0].content }}"
    );
    let t = ChatTemplate::new(src, None, None).unwrap();
    let conv = msgs(&[
        ("system", "s"),
        ("user", "1"),
        ("assistant", "2"),
        ("user", "3"),
        ("assistant", "4"),
    ]);
    // Loop: index 1 skipped (system), 2 and 3 counted, 4 breaks → 2.
    assert_eq!(t.render(&conv, false, &Map::new()).unwrap(), "x|3|yes|a-b|q|2|b1a2|4");
}

#[test]
fn strftime_now_gives_a_date() {
    let t = ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}", None, None).unwrap();
    let out = t.render(&[], false, &Map::new()).unwrap();
    let parts: Vec<&str> = out.split('-').collect();
    assert_eq!(parts.len(), 3, "{out}");
    let year: i32 = parts[0].parse().unwrap();
    assert!(year >= 2024, "{out}");
    assert_eq!(parts[1].len(), 2);
    assert_eq!(parts[2].len(), 2);
}

#[test]
fn bos_eos_are_visible() {
    let t = ChatTemplate::new(
        "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
        Some("<s>"),
        Some("</s>"),
    )
    .unwrap();
    assert_eq!(
        t.render(&msgs(&[("user", "x")]), false, &Map::new()).unwrap(),
        "<s>x</s>"
    );
}

/// A template that lays out tools (in the style of Qwen3's, written for this test) gets the
/// request's tool list and the assistant's calls; one without tools says so.
#[test]
fn tools_and_tool_calls_reach_a_template_that_takes_them() {
    const WITH_TOOLS: &str = "{%- if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>\n{% endif %}\
{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}\
{%- if m.tool_calls %}{% for c in m.tool_calls %}<call>{{ c.function.name }} {{ c.function.arguments | tojson }}</call>{% endfor %}{% endif %}\
{%- if m.tool_call_id %}[{{ m.tool_call_id }}]{% endif %}\n{% endfor %}";
    let t = ChatTemplate::new(WITH_TOOLS, None, None).unwrap();
    assert!(t.takes_tools());
    assert!(!ChatTemplate::new(SMOLLM2, None, None).unwrap().takes_tools());
    let tools = [json!({"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}})];
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls = Some(vec![
        json!({"id": "c1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}),
    ]);
    let mut result = ChatMessage::new("tool", "3 C");
    result.tool_call_id = Some("c1".into());
    let out = t
        .render_with_tools(
            &[ChatMessage::new("user", "Weather?"), call, result],
            Some(&tools),
            false,
            &Map::new(),
        )
        .unwrap();
    assert_eq!(
        out,
        "<tools>weather;</tools>\n<|user|>Weather?<|assistant|><call>weather {\"city\": \"Oslo\"}</call><|tool|>3 C[c1]"
    );
    // Without tools the variable is undefined-like (falsy), as transformers passes None.
    let plain = t.render(&[ChatMessage::new("user", "Hi")], false, &Map::new()).unwrap();
    assert_eq!(plain, "<|user|>Hi");
}
