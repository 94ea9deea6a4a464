//! The in-memory backend of [`Store`](super::Store): the embedded default for one server
//! replica. A restart forgets the records; the engine then recreates adopt-only records from the
//! measurements Argo still asks about, and the agents report the Jobs they still have, so no
//! verdict is lost.

use super::{Created, DispatchJob, DispatchJobStatus, Index, StoreError};

/// Records in this process only.
#[derive(Default)]
pub struct MemoryStore {
    index: Index,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The records.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Creates `job` unless a record of that name exists. Synchronous: there is nothing to wait
    /// for in memory ([`super::Store::create`] is the async face).
    pub fn create(&self, job: DispatchJob) -> Result<Created, StoreError> {
        // Check and insert under one lock: two concurrent creates must not both win.
        Ok(match self.index.insert_new(job) {
            Ok(()) => Created::New,
            Err(existing) => Created::Existing(existing),
        })
    }

    /// Replaces the status of record `name`.
    pub fn set_status(&self, name: &str, status: DispatchJobStatus) -> Result<(), StoreError> {
        self.modify(name, |j| j.status = Some(status))
    }

    /// Asks the agent to delete the Job of record `name`.
    pub fn request_delete(&self, name: &str) -> Result<(), StoreError> {
        self.modify(name, |j| j.spec.delete = true)
    }

    /// Removes record `name`; absent is fine.
    pub fn remove(&self, name: &str) {
        self.index.remove(name);
    }

    fn modify(&self, name: &str, change: impl FnOnce(&mut DispatchJob)) -> Result<(), StoreError> {
        let mut job = self
            .index
            .get(name)
            .ok_or_else(|| StoreError::NotFound(name.to_string()))?;
        change(&mut job);
        self.index.upsert(job);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::job;
    use crate::store::Store;
    use crate::verdict::DestState;

    #[tokio::test]
    async fn create_is_idempotent_and_updates_wake_the_destination() {
        let store = Store::memory();
        let mut rx = store.subscribe("a");
        assert!(matches!(
            store.create(job("j", "a", "r", 1)).await,
            Ok(Created::New)
        ));
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        let Ok(Created::Existing(existing)) = store.create(job("j", "a", "r", 1)).await else {
            panic!("second create must find the first")
        };
        assert_eq!(existing.name, "j");
        store
            .set_status(
                "j",
                DispatchJobStatus::observed(Some(DestState::Succeeded), "agent:a"),
            )
            .await
            .unwrap();
        assert!(rx.has_changed().unwrap());
        assert_eq!(store.get("j").unwrap().status.unwrap().phase, "Succeeded");
        store.request_delete("j").await.unwrap();
        assert!(store.get("j").unwrap().spec.delete);
        assert!(matches!(
            store.request_delete("nope").await,
            Err(StoreError::NotFound(name)) if name == "nope"
        ));
        store.remove("j").await.unwrap();
        assert!(store.is_empty());
        store.remove("j").await.unwrap();
    }
}
