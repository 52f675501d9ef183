//! The Responses API end to end with the official openai client and the openai-agents SDK
//! (`tests/responses_client.py`): whole and streamed responses (events in order, the same text
//! as chat completions), stored responses and `previous_response_id`, structured outputs,
//! function tools, bad input, and an agent run to its final output.
//!
//! Needs the default model and the Python virtualenv (`scripts/test.sh`).

mod serving;
use serving::*;

#[test]
fn the_openai_client_and_the_agents_sdk_use_the_responses_api() {
    let server = start(4, 32);
    run_client_script("responses_client.py", server.port, &[]);
    assert_eq!(metric(server.port, "busy_sessions"), 0.0);
}
