//! Schemas as real code writes them: `instructor` and `pydantic-ai` with pydantic models using
//! `set`, `Optional`, nested models, `Literal`, `EmailStr`, `date` and patterns, against
//! `anelm serve` (`tests/pydantic_clients.py`); every raw answer validates with `jsonschema`,
//! `uniqueItems` included. Needs the default model and the virtualenv (`scripts/test.sh`).

mod serving;
use serving::*;

#[test]
fn instructor_and_pydantic_ai_answers_always_validate() {
    let server = start(2, 16);
    run_client_script("pydantic_clients.py", server.port, &[]);
}
