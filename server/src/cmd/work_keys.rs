//! `rollouts-dispatch work-keys`: prints the public keys of the server's signing keys, the
//! `--work-keys` file of its agents (`signing::work`). Run it with the same key flags (or
//! environment) as `serve`; the output holds no secret.

use std::process::ExitCode;

use clap::Args;

/// `rollouts-dispatch work-keys`
#[derive(Debug, Args)]
pub struct WorkKeysArgs {
    /// The server's key flags, as `serve` has them.
    #[command(flatten)]
    pub keys: super::KeyArgs,
}

/// Runs `rollouts-dispatch work-keys`; returns the exit code.
pub(super) fn run(args: WorkKeysArgs) -> ExitCode {
    match super::serve::signer(&args.keys.signing_key_files, &args.keys.jwt_key_files) {
        Ok(signer) => {
            print!("{}", keys_file(&signer));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rollouts-dispatch work-keys: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The `--work-keys` file of `signer`'s keys: a comment naming each, then the key.
fn keys_file(signer: &crate::signing::Signer) -> String {
    let mut out = String::from(
        "# rollouts-dispatch work keys: give this file to every agent as --work-keys\n",
    );
    for (i, key) in signer.work_public_keys().iter().enumerate() {
        let role = if i == 0 { "signs" } else { "verifies" };
        out.push_str(&format!("# key {} ({role})\n{key}\n", key.id()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signing::{Signer, WorkKeys};

    #[test]
    fn the_printed_file_is_what_the_agent_reads() {
        let signer = Signer::new(&[b"k1-0123456789abcdef0123456789abcdef".to_vec()]).unwrap();
        let dir = std::env::temp_dir().join(format!("rd-work-keys-cmd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("keys");
        std::fs::write(&file, keys_file(&signer)).unwrap();
        let pinned = WorkKeys::from_files(&[file]).unwrap();
        assert_eq!(pinned, WorkKeys::of(&signer));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
