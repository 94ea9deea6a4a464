//! The in-memory [`Store`]: the embedded default for one server replica. A restart forgets the
//! records; the engine then recreates adopt-only records from the measurements Argo still asks
//! about, and the agents report the Jobs they still have, so no verdict is lost.

use std::time::Duration;

use super::{Created, DispatchJob, DispatchJobStatus, Index, Store, StoreError};
use futures::future::BoxFuture;

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

impl Store for MemoryStore {
    fn index(&self) -> &Index {
        &self.index
    }

    fn create(&self, job: DispatchJob) -> BoxFuture<'_, Result<Created, StoreError>> {
        // Check and insert under one lock: two concurrent creates must not both win.
        let result = match self.index.insert_new(job) {
            Ok(()) => Created::New,
            Err(existing) => Created::Existing(existing),
        };
        Box::pin(std::future::ready(Ok(result)))
    }

    fn set_status<'a>(
        &'a self,
        name: &'a str,
        status: DispatchJobStatus,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(std::future::ready(
            self.modify(name, |j| j.status = Some(status)),
        ))
    }

    fn request_delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(std::future::ready(
            self.modify(name, |j| j.spec.delete = true),
        ))
    }

    fn remove<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        self.index.remove(name);
        Box::pin(std::future::ready(Ok(())))
    }

    fn wait_synced(&self, _timeout: Duration) -> BoxFuture<'_, bool> {
        Box::pin(std::future::ready(true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::job;
    use crate::verdict::DestState;

    #[tokio::test]
    async fn create_is_idempotent_and_updates_wake_the_destination() {
        let store = MemoryStore::new();
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
