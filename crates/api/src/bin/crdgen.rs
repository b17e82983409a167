//! Prints a CustomResourceDefinition as YAML: the SafeRollout's, or with the
//! argument `policy` the SafeRolloutPolicy's.
//!
//! `cargo run -p saferollout-api --bin crdgen > deploy/crd.yaml`
//! `cargo run -p saferollout-api --bin crdgen -- policy > deploy/crd-policy.yaml`

fn main() {
    match std::env::args().nth(1).as_deref() {
        None => print!("{}", saferollout_api::crd_yaml()),
        Some("policy") => print!("{}", saferollout_api::policy_crd_yaml()),
        Some(other) => {
            eprintln!("crdgen: unknown argument {other:?}; expected none or `policy`");
            std::process::exit(2);
        }
    }
}
