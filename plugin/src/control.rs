//! go-plugin's control-stream services: `Control.Ping`, `Control.Quit` and `Dispenser.Dispense`.

use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::broker::Broker;
use crate::gob::{self, Empty};
use crate::rpc::{ready, unknown_method, Body, Reply, ReplyFuture, Service};

/// `Control`: liveness pings and the host's request to exit.
pub(crate) struct Control {
    quit: Mutex<Option<oneshot::Sender<()>>>,
}

impl Control {
    /// `quit` fires once the reply to `Control.Quit` has been handed to the connection.
    pub(crate) fn new(quit: oneshot::Sender<()>) -> Self {
        Self {
            quit: Mutex::new(Some(quit)),
        }
    }
}

impl Service for Control {
    fn name(&self) -> &str {
        "Control"
    }

    fn call(&self, method: &str, body: Body<'_>) -> Result<ReplyFuture, gob::Error> {
        match method {
            "Ping" => {
                body.decode::<bool>()?;
                Ok(ready(Reply::ok(Empty)))
            }
            "Quit" => {
                body.decode::<bool>()?;
                let reply = Reply::ok(Empty);
                Ok(ready(match self.quit.lock().expect("quit lock").take() {
                    Some(tx) => reply.notify_when_written(tx),
                    None => reply,
                }))
            }
            _ => unknown_method(&format!("Control.{method}"), body),
        }
    }
}

/// `Dispenser`: hands out a broker stream id for a named plugin.
pub(crate) struct Dispenser {
    plugins: Vec<(String, Arc<dyn Service>)>,
    broker: Arc<Broker>,
}

impl Dispenser {
    pub(crate) fn new(plugins: Vec<(String, Arc<dyn Service>)>, broker: Arc<Broker>) -> Self {
        Self { plugins, broker }
    }
}

impl Service for Dispenser {
    fn name(&self) -> &str {
        "Dispenser"
    }

    fn call(&self, method: &str, body: Body<'_>) -> Result<ReplyFuture, gob::Error> {
        if method != "Dispense" {
            return unknown_method(&format!("Dispenser.{method}"), body);
        }
        let name: String = body.decode()?;
        let Some((_, service)) = self.plugins.iter().find(|(n, _)| *n == name) else {
            return Ok(ready(Reply::error(format!("unknown plugin type: {name}"))));
        };
        let id = self.broker.expect(Arc::clone(service));
        tracing::debug!(plugin = %name, id, "dispensed plugin");
        Ok(ready(Reply::ok(id)))
    }
}
