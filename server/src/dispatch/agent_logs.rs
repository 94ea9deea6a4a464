//! The log of a Job on an agent destination, streamed by its agent over its own outbound
//! connection: the request rides on the agent's long-polled work, the agent `POST`s the lines to
//! `/v1/agents/{destination}/logs/{id}`, and the replica holding the reader's request relays them.

use dispatch_api::logs::{LogEvent, LogRequest};
use futures::stream::{self, BoxStream, StreamExt};

use super::EngineDispatcher;

impl EngineDispatcher {
    /// The log `req` asks for, of a Job on agent destination `destination`.
    // Not built yet: the relay (work item, upload route, replica hand-off) comes next.
    #[allow(dead_code)]
    pub(crate) fn agent_job_log(
        &self,
        destination: &str,
        req: LogRequest,
    ) -> BoxStream<'static, LogEvent> {
        stream::iter([LogEvent::Note {
            destination: destination.to_string(),
            pod: None,
            text: format!(
                "the log of Job {}/{} is on an agent destination, whose logs this server does \
                 not relay yet",
                req.namespace, req.job
            ),
        }])
        .boxed()
    }
}
