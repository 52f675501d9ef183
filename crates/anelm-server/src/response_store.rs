//! Where stored responses (the Responses API's `store`) live: the job database when the server
//! has a data directory (they survive restarts), else memory, bounded to the most recent
//! [`MEMORY_BOUND`] responses.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;

use crate::job_store::{JobStore, StoreError};

/// Most responses kept in memory when there is no data directory.
pub const MEMORY_BOUND: usize = 1000;

/// A response and the conversation it ends.
type Stored = (String, Value, Value);

/// The stored responses.
#[derive(Default)]
pub struct ResponseStore {
    db: OnceLock<Arc<JobStore>>,
    memory: Mutex<VecDeque<Stored>>,
}

impl ResponseStore {
    /// Keep responses in `db` from now on.
    pub fn use_db(&self, db: Arc<JobStore>) {
        let _ = self.db.set(db);
    }

    /// Whether responses survive a restart.
    pub fn durable(&self) -> bool {
        self.db.get().is_some()
    }

    /// Store a response and its conversation.
    pub fn put(&self, id: &str, response: &Value, messages: &Value) -> Result<(), StoreError> {
        if let Some(db) = self.db.get() {
            return db.put_response(id, response, messages);
        }
        let mut m = self.memory.lock().map_err(|_| StoreError::Poisoned)?;
        m.retain(|(k, _, _)| k != id);
        m.push_back((id.to_string(), response.clone(), messages.clone()));
        while m.len() > MEMORY_BOUND {
            m.pop_front();
        }
        Ok(())
    }

    /// A stored response and its conversation.
    pub fn get(&self, id: &str) -> Result<Option<(Value, Value)>, StoreError> {
        if let Some(db) = self.db.get() {
            return db.response(id);
        }
        let m = self.memory.lock().map_err(|_| StoreError::Poisoned)?;
        Ok(m.iter()
            .find(|(k, _, _)| k == id)
            .map(|(_, r, c)| (r.clone(), c.clone())))
    }

    /// Delete a stored response; false when there was none.
    pub fn delete(&self, id: &str) -> Result<bool, StoreError> {
        if let Some(db) = self.db.get() {
            return db.delete_response(id);
        }
        let mut m = self.memory.lock().map_err(|_| StoreError::Poisoned)?;
        let before = m.len();
        m.retain(|(k, _, _)| k != id);
        Ok(m.len() < before)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn memory_is_bounded_and_the_database_is_used_once_set() {
        let s = ResponseStore::default();
        for i in 0..MEMORY_BOUND + 5 {
            s.put(&format!("r{i}"), &json!({"i": i}), &json!([])).unwrap();
        }
        assert!(s.get("r0").unwrap().is_none());
        assert_eq!(
            s.get(&format!("r{}", MEMORY_BOUND + 4)).unwrap().unwrap().0["i"],
            MEMORY_BOUND + 4
        );
        assert!(s.delete("r10").unwrap());
        assert!(!s.delete("r10").unwrap());
        let db = Arc::new(JobStore::in_memory().unwrap());
        s.use_db(db.clone());
        assert!(s.durable());
        s.put("x", &json!({"a": 1}), &json!([{"role": "user"}])).unwrap();
        assert_eq!(db.response("x").unwrap().unwrap().1[0]["role"], "user");
    }
}
