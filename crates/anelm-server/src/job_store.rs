//! The durable state of the Files and Batch APIs: one SQLite database in the data directory
//! (WAL journal, `synchronous=FULL`), so a crash at any instant — SIGKILL, power loss — leaves
//! each change either done or not done, never half. Uploaded files and a batch's output files
//! are rows (their ids never become paths); a batch's input lines are copied into their own
//! rows when the batch is created, and each line's result is written in the same transaction
//! that marks it done, exactly once: a line still marked pending after a crash runs again, and
//! a done line never does.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Value, json};

/// What can go wrong with the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite refused or failed.
    #[error("the job database failed: {0} (check the data directory's permissions and free space)")]
    Sqlite(#[from] rusqlite::Error),
    /// A lock holder panicked.
    #[error("the job database lock is poisoned: restart the server")]
    Poisoned,
}

/// Store results.
pub type Result<T> = std::result::Result<T, StoreError>;

/// An uploaded or generated file.
#[derive(Clone, Debug, PartialEq)]
pub struct FileRow {
    /// `file-…`.
    pub id: String,
    /// `batch` (uploads), `batch_output` (results).
    pub purpose: String,
    /// The name it was uploaded with.
    pub filename: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Unix seconds.
    pub created_at: u64,
}

impl FileRow {
    /// OpenAI's `file` object.
    pub fn to_json(&self) -> Value {
        json!({"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
               "filename": self.filename, "purpose": self.purpose, "status": "processed",
               "expires_at": null, "status_details": null})
    }
}

/// A batch's life, as OpenAI names it.
pub const ACTIVE_STATUSES: &[&str] = &["validating", "in_progress", "finalizing", "cancelling"];

/// One batch.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchRow {
    /// `batch_…`.
    pub id: String,
    /// `/v1/chat/completions`, `/v1/completions` or `/v1/embeddings`.
    pub endpoint: String,
    /// The uploaded file its lines came from.
    pub input_file_id: String,
    /// `24h`.
    pub completion_window: String,
    /// `validating`, `in_progress`, `finalizing`, `completed`, `failed`, `expired`,
    /// `cancelling`, `cancelled`.
    pub status: String,
    /// The caller's metadata (an object or null).
    pub metadata: Value,
    /// Its lines never leave the machine (created as a private request).
    pub private: bool,
    /// Results of the lines that succeeded.
    pub output_file_id: Option<String>,
    /// Results of the lines that failed.
    pub error_file_id: Option<String>,
    /// Unix seconds of each transition (0: not reached).
    pub times: BatchTimes,
    /// Lines in all, succeeded, failed.
    pub counts: (u64, u64, u64),
}

/// When a batch reached each status (0: never).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BatchTimes {
    /// Created.
    pub created_at: u64,
    /// Started running.
    pub in_progress_at: u64,
    /// Past this it expires.
    pub expires_at: u64,
    /// Writing its output files.
    pub finalizing_at: u64,
    /// Done.
    pub completed_at: u64,
    /// Failed.
    pub failed_at: u64,
    /// Expired.
    pub expired_at: u64,
    /// Cancel asked.
    pub cancelling_at: u64,
    /// Cancelled.
    pub cancelled_at: u64,
}

impl BatchRow {
    /// OpenAI's `batch` object.
    pub fn to_json(&self) -> Value {
        let t = |v: u64| if v == 0 { Value::Null } else { json!(v) };
        let tm = &self.times;
        json!({
            "id": self.id, "object": "batch", "endpoint": self.endpoint, "errors": null,
            "input_file_id": self.input_file_id, "completion_window": self.completion_window,
            "status": self.status, "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id, "created_at": tm.created_at,
            "in_progress_at": t(tm.in_progress_at), "expires_at": t(tm.expires_at),
            "finalizing_at": t(tm.finalizing_at), "completed_at": t(tm.completed_at),
            "failed_at": t(tm.failed_at), "expired_at": t(tm.expired_at),
            "cancelling_at": t(tm.cancelling_at), "cancelled_at": t(tm.cancelled_at),
            "request_counts": {"total": self.counts.0, "completed": self.counts.1, "failed": self.counts.2},
            "metadata": self.metadata,
        })
    }
}

/// One input line of a batch, as validated.
#[derive(Clone, Debug, PartialEq)]
pub struct NewLine {
    /// The caller's id for it.
    pub custom_id: String,
    /// The request body (JSON text).
    pub body: String,
}

/// A line waiting to run.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingLine {
    /// Its batch.
    pub batch_id: String,
    /// 1-based line number in the input file.
    pub line_no: u64,
    /// The caller's id for it.
    pub custom_id: String,
    /// The request body (JSON text).
    pub body: String,
}

/// How a line ended: the HTTP status and body its request got.
#[derive(Clone, Debug, PartialEq)]
pub struct LineResult {
    /// HTTP status of the response.
    pub status: u16,
    /// The response body (JSON).
    pub body: Value,
}

/// The job database.
pub struct JobStore {
    conn: Mutex<Connection>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, purpose TEXT NOT NULL, filename TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, content BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL, completion_window TEXT NOT NULL, status TEXT NOT NULL,
    metadata TEXT NOT NULL, private INTEGER NOT NULL, output_file_id TEXT, error_file_id TEXT,
    created_at INTEGER NOT NULL, in_progress_at INTEGER NOT NULL DEFAULT 0,
    expires_at INTEGER NOT NULL, finalizing_at INTEGER NOT NULL DEFAULT 0,
    completed_at INTEGER NOT NULL DEFAULT 0, failed_at INTEGER NOT NULL DEFAULT 0,
    expired_at INTEGER NOT NULL DEFAULT 0, cancelling_at INTEGER NOT NULL DEFAULT 0,
    cancelled_at INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS batch_lines (
    batch_id TEXT NOT NULL, line_no INTEGER NOT NULL, custom_id TEXT NOT NULL,
    body TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'pending', status INTEGER, result TEXT,
    PRIMARY KEY (batch_id, line_no)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS batch_lines_state ON batch_lines (batch_id, state);
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, created_at INTEGER NOT NULL, response TEXT NOT NULL, messages TEXT NOT NULL);
";

const BATCH_COLUMNS: &str = "id, endpoint, input_file_id, completion_window, status, metadata, private, \
     output_file_id, error_file_id, created_at, in_progress_at, expires_at, finalizing_at, completed_at, \
     failed_at, expired_at, cancelling_at, cancelled_at";

/// A fresh id: `prefix` and 24 hex digits (random per process, a counter, the time).
pub fn new_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(nanos);
    h.write_u64(n);
    h.write_u32(std::process::id());
    format!("{prefix}{:016x}{:08x}", h.finish(), (nanos as u32) ^ (n as u32))
}

fn now() -> u64 {
    crate::now()
}

impl JobStore {
    /// Open (creating) the database at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = Connection::open(path)?;
        Self::init(conn)
    }

    /// A database in memory (tests).
    pub fn in_memory() -> Result<Self> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(conn: Connection) -> Result<Self> {
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        // WAL: readers never block the writer; FULL: a commit survives power loss.
        let _: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.execute_batch(SCHEMA)?;
        Ok(Self { conn: Mutex::new(conn) })
    }

    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>) -> Result<T> {
        let mut c = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        Ok(f(&mut c)?)
    }

    /// Store a file whole (one transaction: it exists complete or not at all).
    pub fn insert_file(&self, purpose: &str, filename: &str, content: &[u8]) -> Result<FileRow> {
        let row = FileRow {
            id: new_id("file-"),
            purpose: purpose.to_string(),
            filename: filename.to_string(),
            bytes: content.len() as u64,
            created_at: now(),
        };
        self.with(|c| {
            c.execute(
                "INSERT INTO files (id, purpose, filename, bytes, created_at, content) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    row.id,
                    row.purpose,
                    row.filename,
                    row.bytes as i64,
                    row.created_at as i64,
                    content
                ],
            )
        })?;
        Ok(row)
    }

    fn file_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<FileRow> {
        Ok(FileRow {
            id: r.get(0)?,
            purpose: r.get(1)?,
            filename: r.get(2)?,
            bytes: r.get::<_, i64>(3)? as u64,
            created_at: r.get::<_, i64>(4)? as u64,
        })
    }

    /// A file's description.
    pub fn file(&self, id: &str) -> Result<Option<FileRow>> {
        self.with(|c| {
            c.query_row(
                "SELECT id, purpose, filename, bytes, created_at FROM files WHERE id = ?1",
                [id],
                Self::file_row,
            )
            .optional()
        })
    }

    /// A file's bytes.
    pub fn file_content(&self, id: &str) -> Result<Option<Vec<u8>>> {
        self.with(|c| {
            c.query_row("SELECT content FROM files WHERE id = ?1", [id], |r| r.get(0))
                .optional()
        })
    }

    /// Files, newest first (or oldest with `ascending`), optionally of one purpose, after the
    /// file `after` in that order; at most `limit`, and whether more follow.
    pub fn list_files(
        &self,
        purpose: Option<&str>,
        after: Option<&str>,
        limit: usize,
        ascending: bool,
    ) -> Result<(Vec<FileRow>, bool)> {
        self.with(|c| {
            let (cmp, order) = if ascending { (">", "ASC") } else { ("<", "DESC") };
            let sql = format!(
                "SELECT id, purpose, filename, bytes, created_at FROM files
                 WHERE (?1 IS NULL OR purpose = ?1)
                   AND (?2 IS NULL OR (created_at, id) {cmp} (SELECT created_at, id FROM files WHERE id = ?2))
                 ORDER BY created_at {order}, id {order} LIMIT ?3"
            );
            let mut st = c.prepare(&sql)?;
            let mut rows: Vec<FileRow> = st
                .query_map(params![purpose, after, (limit + 1) as i64], Self::file_row)?
                .collect::<rusqlite::Result<_>>()?;
            let more = rows.len() > limit;
            rows.truncate(limit);
            Ok((rows, more))
        })
    }

    /// Delete a file; false when there was none.
    pub fn delete_file(&self, id: &str) -> Result<bool> {
        self.with(|c| Ok(c.execute("DELETE FROM files WHERE id = ?1", [id])? > 0))
    }

    /// Create a batch and its lines in one transaction, already running (validation happened
    /// before). `window_secs` after now it expires.
    #[allow(clippy::too_many_arguments)]
    pub fn create_batch(
        &self,
        endpoint: &str,
        input_file_id: &str,
        completion_window: &str,
        window_secs: u64,
        metadata: &Value,
        private: bool,
        lines: &[NewLine],
    ) -> Result<BatchRow> {
        let id = new_id("batch_");
        let t = now();
        self.with(|c| {
            let tx = c.transaction()?;
            tx.execute(
                "INSERT INTO batches (id, endpoint, input_file_id, completion_window, status, metadata, private,
                     created_at, in_progress_at, expires_at)
                 VALUES (?1, ?2, ?3, ?4, 'in_progress', ?5, ?6, ?7, ?7, ?8)",
                params![
                    id,
                    endpoint,
                    input_file_id,
                    completion_window,
                    metadata.to_string(),
                    private,
                    t as i64,
                    (t + window_secs) as i64
                ],
            )?;
            {
                let mut ins =
                    tx.prepare("INSERT INTO batch_lines (batch_id, line_no, custom_id, body) VALUES (?1, ?2, ?3, ?4)")?;
                for (i, l) in lines.iter().enumerate() {
                    ins.execute(params![id, (i + 1) as i64, l.custom_id, l.body])?;
                }
            }
            tx.commit()
        })?;
        self.batch(&id)?
            .ok_or(StoreError::Sqlite(rusqlite::Error::QueryReturnedNoRows))
    }

    fn batch_row(c: &Connection, r: &rusqlite::Row<'_>) -> rusqlite::Result<BatchRow> {
        let id: String = r.get(0)?;
        let g = |i: usize| r.get::<_, i64>(i).map(|v| v as u64);
        let metadata: String = r.get(5)?;
        let counts = c.query_row(
            "SELECT COUNT(*), COALESCE(SUM(state = 'done'), 0), COALESCE(SUM(state = 'failed'), 0)
             FROM batch_lines WHERE batch_id = ?1",
            [&id],
            |q| {
                Ok((
                    q.get::<_, i64>(0)? as u64,
                    q.get::<_, i64>(1)? as u64,
                    q.get::<_, i64>(2)? as u64,
                ))
            },
        )?;
        Ok(BatchRow {
            endpoint: r.get(1)?,
            input_file_id: r.get(2)?,
            completion_window: r.get(3)?,
            status: r.get(4)?,
            metadata: serde_json::from_str(&metadata).unwrap_or(Value::Null),
            private: r.get(6)?,
            output_file_id: r.get(7)?,
            error_file_id: r.get(8)?,
            times: BatchTimes {
                created_at: g(9)?,
                in_progress_at: g(10)?,
                expires_at: g(11)?,
                finalizing_at: g(12)?,
                completed_at: g(13)?,
                failed_at: g(14)?,
                expired_at: g(15)?,
                cancelling_at: g(16)?,
                cancelled_at: g(17)?,
            },
            counts,
            id,
        })
    }

    /// One batch.
    pub fn batch(&self, id: &str) -> Result<Option<BatchRow>> {
        self.with(|c| {
            c.query_row(
                &format!("SELECT {BATCH_COLUMNS} FROM batches WHERE id = ?1"),
                [id],
                |r| Self::batch_row(c, r),
            )
            .optional()
        })
    }

    /// Batches, newest first, after the batch `after`; at most `limit`, and whether more follow.
    pub fn list_batches(&self, after: Option<&str>, limit: usize) -> Result<(Vec<BatchRow>, bool)> {
        self.with(|c| {
            let mut st = c.prepare(&format!(
                "SELECT {BATCH_COLUMNS} FROM batches
                 WHERE (?1 IS NULL OR seq < (SELECT seq FROM batches WHERE id = ?1))
                 ORDER BY seq DESC LIMIT ?2"
            ))?;
            let mut rows: Vec<BatchRow> = st
                .query_map(params![after, (limit + 1) as i64], |r| Self::batch_row(c, r))?
                .collect::<rusqlite::Result<_>>()?;
            let more = rows.len() > limit;
            rows.truncate(limit);
            Ok((rows, more))
        })
    }

    /// Batches that still have work (oldest first): running, cancelling or finalizing.
    pub fn active_batches(&self) -> Result<Vec<BatchRow>> {
        self.with(|c| {
            let mut st = c.prepare(&format!(
                "SELECT {BATCH_COLUMNS} FROM batches
                 WHERE status IN ('validating', 'in_progress', 'finalizing', 'cancelling') ORDER BY seq ASC"
            ))?;
            st.query_map([], |r| Self::batch_row(c, r))?.collect()
        })
    }

    /// Ask a running batch to stop: `cancelling` (the runner then ends it as `cancelled`).
    /// Returns whether this call asked it, and the batch as it is now; `None` when there is no
    /// such batch.
    pub fn cancel_batch(&self, id: &str) -> Result<Option<(bool, BatchRow)>> {
        let changed = self.with(|c| {
            c.execute(
                "UPDATE batches SET status = 'cancelling', cancelling_at = ?2
                 WHERE id = ?1 AND status IN ('validating', 'in_progress')",
                params![id, now() as i64],
            )
        })? > 0;
        Ok(self.batch(id)?.map(|b| (changed, b)))
    }

    /// Up to `limit` lines of `batch_id` still pending, in input order, skipping `busy` ones.
    pub fn pending_lines(&self, batch_id: &str, limit: usize, busy: &[u64]) -> Result<Vec<PendingLine>> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT line_no, custom_id, body FROM batch_lines
                 WHERE batch_id = ?1 AND state = 'pending' ORDER BY line_no ASC LIMIT ?2",
            )?;
            let rows = st.query_map(params![batch_id, (limit + busy.len()) as i64], |r| {
                Ok(PendingLine {
                    batch_id: batch_id.to_string(),
                    line_no: r.get::<_, i64>(0)? as u64,
                    custom_id: r.get(1)?,
                    body: r.get(2)?,
                })
            })?;
            let mut out = Vec::new();
            for l in rows {
                let l = l?;
                if !busy.contains(&l.line_no) && out.len() < limit {
                    out.push(l);
                }
            }
            Ok(out)
        })
    }

    /// Record a line's result and mark it done (2xx) or failed, in one transaction; a line
    /// that is no longer pending is left alone (false): each line has exactly one result.
    pub fn finish_line(&self, batch_id: &str, line_no: u64, result: &LineResult) -> Result<bool> {
        let state = if (200..300).contains(&result.status) {
            "done"
        } else {
            "failed"
        };
        self.with(|c| {
            Ok(c.execute(
                "UPDATE batch_lines SET state = ?3, status = ?4, result = ?5
                 WHERE batch_id = ?1 AND line_no = ?2 AND state = 'pending'",
                params![
                    batch_id,
                    line_no as i64,
                    state,
                    i64::from(result.status),
                    result.body.to_string()
                ],
            )? == 1)
        })
    }

    /// End a batch: write its output file (lines that succeeded) and error file (lines that
    /// failed, and — for a cancelled or expired batch — lines that never ran), in input order
    /// with their `custom_id`s, and set its final `status`, all in one transaction. A batch
    /// already final is returned unchanged.
    pub fn finalize(&self, batch_id: &str, status: &str) -> Result<Option<BatchRow>> {
        let t = now() as i64;
        self.with(|c| {
            let tx = c.transaction()?;
            let current: Option<String> = tx
                .query_row("SELECT status FROM batches WHERE id = ?1", [batch_id], |r| r.get(0))
                .optional()?;
            if !current.is_some_and(|s| ACTIVE_STATUSES.contains(&s.as_str())) {
                return tx.commit();
            }
            let (mut out, mut err) = (Vec::<u8>::new(), Vec::<u8>::new());
            {
                let mut st = tx.prepare(
                    "SELECT line_no, custom_id, state, status, result FROM batch_lines
                     WHERE batch_id = ?1 ORDER BY line_no ASC",
                )?;
                let mut rows = st.query([batch_id])?;
                while let Some(r) = rows.next()? {
                    let line_no: i64 = r.get(0)?;
                    let custom_id: String = r.get(1)?;
                    let state: String = r.get(2)?;
                    let code: Option<i64> = r.get(3)?;
                    let result: Option<String> = r.get(4)?;
                    let rid = format!("batch_req_{}_{line_no}", batch_id.trim_start_matches("batch_"));
                    let line = if state == "pending" {
                        let (code, message) = match status {
                            "expired" => ("batch_expired", "the batch expired before this request ran"),
                            "cancelled" => ("batch_cancelled", "the batch was cancelled before this request ran"),
                            _ => ("batch_failed", "the batch ended before this request ran"),
                        };
                        json!({"id": rid, "custom_id": custom_id, "response": null,
                               "error": {"code": code, "message": message}})
                    } else {
                        let body: Value = result
                            .as_deref()
                            .and_then(|s| serde_json::from_str(s).ok())
                            .unwrap_or(Value::Null);
                        let error = if state == "failed" {
                            let msg = body
                                .pointer("/error/message")
                                .and_then(Value::as_str)
                                .unwrap_or("the request failed");
                            json!({"code": body.pointer("/error/code").cloned().unwrap_or(Value::Null),
                                   "message": msg})
                        } else {
                            Value::Null
                        };
                        json!({"id": rid, "custom_id": custom_id,
                               "response": {"status_code": code.unwrap_or(0), "request_id": rid, "body": body},
                               "error": error})
                    };
                    let target = if state == "done" { &mut out } else { &mut err };
                    target.extend_from_slice(line.to_string().as_bytes());
                    target.push(b'\n');
                }
            }
            let file_id = |content: &[u8], suffix: &str| -> rusqlite::Result<Option<String>> {
                if content.is_empty() {
                    return Ok(None);
                }
                let id = new_id("file-");
                tx.execute(
                    "INSERT INTO files (id, purpose, filename, bytes, created_at, content)
                     VALUES (?1, 'batch_output', ?2, ?3, ?4, ?5)",
                    params![
                        id,
                        format!("{batch_id}_{suffix}.jsonl"),
                        content.len() as i64,
                        t,
                        content
                    ],
                )?;
                Ok(Some(id))
            };
            let output_file_id = file_id(&out, "output")?;
            let error_file_id = file_id(&err, "error")?;
            let stamp = match status {
                "completed" => "completed_at",
                "cancelled" => "cancelled_at",
                "expired" => "expired_at",
                _ => "failed_at",
            };
            tx.execute(
                &format!(
                    "UPDATE batches SET status = ?2, output_file_id = ?3, error_file_id = ?4,
                         finalizing_at = CASE WHEN finalizing_at = 0 THEN ?5 ELSE finalizing_at END, {stamp} = ?5
                     WHERE id = ?1"
                ),
                params![batch_id, status, output_file_id, error_file_id, t],
            )?;
            tx.commit()
        })?;
        self.batch(batch_id)
    }

    /// Keep a stored response (Responses API, `store: true`): the response object and the
    /// conversation up to and including its answer (chat messages), which a later request
    /// continues with `previous_response_id`.
    pub fn put_response(&self, id: &str, response: &Value, messages: &Value) -> Result<()> {
        self.with(|c| {
            c.execute(
                "INSERT OR REPLACE INTO responses (id, created_at, response, messages) VALUES (?1, ?2, ?3, ?4)",
                params![id, now() as i64, response.to_string(), messages.to_string()],
            )
        })?;
        Ok(())
    }

    /// A stored response and its conversation.
    pub fn response(&self, id: &str) -> Result<Option<(Value, Value)>> {
        let row: Option<(String, String)> = self.with(|c| {
            c.query_row("SELECT response, messages FROM responses WHERE id = ?1", [id], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()
        })?;
        Ok(row.map(|(r, m)| {
            (
                serde_json::from_str(&r).unwrap_or(Value::Null),
                serde_json::from_str(&m).unwrap_or(Value::Null),
            )
        }))
    }

    /// Delete a stored response; false when there was none.
    pub fn delete_response(&self, id: &str) -> Result<bool> {
        self.with(|c| Ok(c.execute("DELETE FROM responses WHERE id = ?1", [id])? > 0))
    }

    /// Mark a batch as writing its results (`finalizing`).
    pub fn set_finalizing(&self, batch_id: &str) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE batches SET status = 'finalizing', finalizing_at = ?2 WHERE id = ?1 AND status = 'in_progress'",
                params![batch_id, now() as i64],
            )
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: usize) -> Vec<NewLine> {
        (0..n)
            .map(|i| NewLine {
                custom_id: format!("r{i}"),
                body: format!("{{\"i\":{i}}}"),
            })
            .collect()
    }

    fn ok(i: u64) -> LineResult {
        LineResult {
            status: 200,
            body: json!({"i": i}),
        }
    }

    #[test]
    fn files_round_trip_and_list_in_pages() {
        let s = JobStore::in_memory().unwrap();
        let a = s.insert_file("batch", "a.jsonl", b"{}\n").unwrap();
        let b = s.insert_file("batch", "b.jsonl", b"{}\n{}\n").unwrap();
        assert_eq!(s.file(&a.id).unwrap().unwrap(), a);
        assert_eq!(s.file_content(&b.id).unwrap().unwrap(), b"{}\n{}\n");
        let (page, more) = s.list_files(None, None, 1, true).unwrap();
        assert_eq!((page.len(), more), (1, true));
        let (rest, more) = s.list_files(None, Some(&page[0].id), 10, true).unwrap();
        assert_eq!((rest.len(), more), (1, false));
        assert_ne!(rest[0].id, page[0].id);
        assert!(s.delete_file(&a.id).unwrap());
        assert!(!s.delete_file(&a.id).unwrap());
        assert!(s.file(&a.id).unwrap().is_none());
    }

    #[test]
    fn each_line_gets_exactly_one_result() {
        let s = JobStore::in_memory().unwrap();
        let b = s
            .create_batch(
                "/v1/completions",
                "file-x",
                "24h",
                86400,
                &Value::Null,
                false,
                &lines(3),
            )
            .unwrap();
        assert_eq!(b.status, "in_progress");
        assert_eq!(b.counts, (3, 0, 0));
        let p = s.pending_lines(&b.id, 10, &[2]).unwrap();
        assert_eq!(p.iter().map(|l| l.line_no).collect::<Vec<_>>(), vec![1, 3]);
        assert!(s.finish_line(&b.id, 1, &ok(1)).unwrap());
        // A second result for the same line (a rerun after a crash raced it) is refused.
        assert!(!s.finish_line(&b.id, 1, &ok(9)).unwrap());
        let bad = LineResult {
            status: 400,
            body: json!({"error": {"message": "no", "code": "invalid_request"}}),
        };
        assert!(s.finish_line(&b.id, 2, &bad).unwrap());
        assert!(s.finish_line(&b.id, 3, &ok(3)).unwrap());
        assert_eq!(s.batch(&b.id).unwrap().unwrap().counts, (3, 2, 1));
        let done = s.finalize(&b.id, "completed").unwrap().unwrap();
        assert_eq!(done.status, "completed");
        let out = s
            .file_content(done.output_file_id.as_deref().unwrap())
            .unwrap()
            .unwrap();
        let out: Vec<Value> = out
            .split(|&c| c == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0]["custom_id"], "r0");
        assert_eq!(out[0]["response"]["body"]["i"], 1);
        assert_eq!(out[1]["custom_id"], "r2");
        let err = s.file_content(done.error_file_id.as_deref().unwrap()).unwrap().unwrap();
        let err: Value = serde_json::from_slice(err.trim_ascii_end()).unwrap();
        assert_eq!(err["custom_id"], "r1");
        assert_eq!(err["response"]["status_code"], 400);
        assert_eq!(err["error"]["message"], "no");
        // Finalizing again changes nothing.
        assert_eq!(s.finalize(&b.id, "failed").unwrap().unwrap(), done);
    }

    #[test]
    fn a_cancelled_batch_reports_the_lines_that_never_ran() {
        let s = JobStore::in_memory().unwrap();
        let b = s
            .create_batch(
                "/v1/embeddings",
                "file-x",
                "24h",
                86400,
                &json!({"k": "v"}),
                true,
                &lines(2),
            )
            .unwrap();
        assert!(s.finish_line(&b.id, 1, &ok(1)).unwrap());
        let (asked, row) = s.cancel_batch(&b.id).unwrap().unwrap();
        assert!(asked);
        assert_eq!(row.status, "cancelling");
        let done = s.finalize(&b.id, "cancelled").unwrap().unwrap();
        assert_eq!(done.status, "cancelled");
        assert!(done.times.cancelled_at > 0);
        let err = s.file_content(done.error_file_id.as_deref().unwrap()).unwrap().unwrap();
        let err: Value = serde_json::from_slice(err.trim_ascii_end()).unwrap();
        assert_eq!(err["custom_id"], "r1");
        assert_eq!(err["error"]["code"], "batch_cancelled");
        assert_eq!(done.to_json()["metadata"]["k"], "v");
        assert_eq!(done.to_json()["request_counts"]["total"], 2);
    }

    #[test]
    fn state_survives_reopening_the_database() {
        let dir = std::env::temp_dir().join(new_id("anelm-store-test-"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("jobs.sqlite");
        let id = {
            let s = JobStore::open(&path).unwrap();
            let b = s
                .create_batch(
                    "/v1/completions",
                    "file-x",
                    "24h",
                    86400,
                    &Value::Null,
                    false,
                    &lines(2),
                )
                .unwrap();
            assert!(s.finish_line(&b.id, 2, &ok(2)).unwrap());
            b.id
        };
        let s = JobStore::open(&path).unwrap();
        let active = s.active_batches().unwrap();
        assert_eq!(active.len(), 1);
        assert_eq!(active[0].id, id);
        let p = s.pending_lines(&id, 10, &[]).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].custom_id, "r0");
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
