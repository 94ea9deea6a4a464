//! `rollouts-dispatch`: companion server and agent (not implemented yet; see the README).

fn main() {
    eprintln!(
        "rollouts-dispatch {}: the server and agent are not implemented yet; \
         only the Argo Rollouts plugin (rollouts-dispatch-plugin) is usable in this version",
        dispatch_server::VERSION
    );
    std::process::exit(2);
}
