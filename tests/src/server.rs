//! `rollouts-dispatch serve` running inside the test process, started from the same flags as
//! the binary (so a test reads like the command line an operator types), and killed and started
//! again on the same ports when a scenario needs a server restart.

use std::ffi::OsString;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use dispatch_server::cmd::ServeArgs;

use crate::admin::wait_ready;

/// `rollouts-dispatch serve`'s flags, parsed as the binary parses them.
#[derive(Debug, Parser)]
#[command(name = "serve")]
struct ServeCommand {
    #[command(flatten)]
    args: ServeArgs,
}

/// An in-process `rollouts-dispatch serve`; dropping it stops the server.
#[derive(Debug)]
pub struct Server {
    args: ServeArgs,
    /// The API port (TLS when the flags give `--tls-cert/--tls-key`, as every scene does).
    pub port: u16,
    /// The admin port (`/ready`, `/metrics`).
    pub admin_port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Starts the server with `flags` (those of `rollouts-dispatch serve`, which must include
    /// `--listen` and `--admin-listen`) and waits until it is ready.
    pub async fn start<I, T>(flags: I) -> Result<Self>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let argv =
            std::iter::once(OsString::from("serve")).chain(flags.into_iter().map(Into::into));
        let args = ServeCommand::try_parse_from(argv)
            .context("parsing the `rollouts-dispatch serve` flags of the test server")?
            .args;
        let task = spawn(&args);
        let server = Self {
            port: args.listen.port(),
            admin_port: args.admin.admin_listen.port(),
            args,
            task,
        };
        wait_ready("rollouts-dispatch serve", server.admin_port).await?;
        Ok(server)
    }

    /// Kills the server abruptly (its engine, watches and listeners go with it), keeps it down
    /// for `down_for`, and starts a fresh one with the same flags; waits until it is ready.
    pub async fn restart(&mut self, down_for: Duration) -> Result<()> {
        self.task.abort();
        let _ = (&mut self.task).await;
        tokio::time::sleep(down_for).await;
        self.task = spawn(&self.args);
        wait_ready("the restarted rollouts-dispatch serve", self.admin_port).await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn spawn(args: &ServeArgs) -> tokio::task::JoinHandle<()> {
    let args = args.clone();
    tokio::spawn(async move {
        if let Err(e) = dispatch_server::cmd::serve::serve(args).await {
            eprintln!("rollouts-dispatch serve stopped: {e:#}");
        }
    })
}
