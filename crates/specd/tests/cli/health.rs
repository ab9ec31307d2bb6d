//! `specd health` as a container health check runs it: exit status 0 only while the server
//! reports SERVING.

use std::process::{Command, Output};

use crate::served::Service;

fn health(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_specd"))
        .arg("health")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_serving_verifier_passes_and_anything_else_fails() {
    let mut verifier = Service::verifier();

    let whole = health(&["--addr", &verifier.url]);
    assert!(whole.status.success(), "{whole:?}");
    assert_eq!(String::from_utf8_lossy(&whole.stdout).trim(), "SERVING");

    let named = health(&["--addr", &verifier.url, "--service", "specd.v1.Verifier"]);
    assert!(named.status.success(), "{named:?}");

    let unknown = health(&["--addr", &verifier.url, "--service", "no.such.Service"]);
    assert!(!unknown.status.success());
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("no.such.Service"),
        "{unknown:?}"
    );

    let url = verifier.url.clone();
    verifier.terminate();
    assert!(verifier.wait().success());
    let gone = health(&["--addr", &url, "--timeout-secs", "2"]);
    assert!(!gone.status.success());
    assert!(
        String::from_utf8_lossy(&gone.stderr).contains("connecting to"),
        "{gone:?}"
    );

    let bad = health(&["--addr", "not a url"]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("addr"),
        "{bad:?}"
    );
}
