//! TLS and mutual TLS with real processes and certificates made at test time (rcgen):
//! an agent ships over mutual TLS and `hourglass query` reads over it; a client without a
//! certificate, with one from another CA, trusting the wrong CA, or facing an expired
//! server certificate is refused; a renewed certificate takes effect without a restart.

use std::time::{Duration, Instant};

use crate::faults::{JOIN_WAIT, agg_metric, wait_until_within};
use crate::nats::NatsCluster;
use crate::util::{AgentProcess, AggregatorProcess, TempDir, hourglass};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority that writes what it issues into the test's directory.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    name: String,
}

impl Ca {
    fn new(dir: &TempDir, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("hourglass test CA {name}"),
        );
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.file(&format!("{name}.pem")), issuer.pem()).unwrap();
        Ca {
            issuer,
            name: name.to_string(),
        }
    }

    fn pem(&self, dir: &TempDir) -> String {
        dir.file(&format!("{}.pem", self.name))
    }

    /// Issues a certificate for 127.0.0.1 and localhost; returns (cert, key) paths.
    fn issue(&self, dir: &TempDir, file: &str, client: bool, expired: bool) -> (String, String) {
        let usage = if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        };
        self.issue_for(dir, file, vec![usage], expired)
    }

    /// [`Ca::issue`] with the extended key usages `usages`.
    fn issue_for(
        &self,
        dir: &TempDir,
        file: &str,
        usages: Vec<ExtendedKeyUsagePurpose>,
        expired: bool,
    ) -> (String, String) {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, file.to_string());
        params.extended_key_usages = usages;
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_path, key_path) = (
            dir.file(&format!("{file}.pem")),
            dir.file(&format!("{file}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }
}

fn https(agg: &AggregatorProcess) -> String {
    agg.grpc.replacen("http://", "https://", 1)
}

/// `hourglass query distinct` of `visitors` over the last hours, with `tls` flags.
fn query(url: &str, tls: &[&str]) -> crate::util::Run {
    let mut args = vec![
        "query",
        "distinct",
        "--metric",
        "visitors",
        "--aggregator",
        url,
        "--from",
        "-3h",
        "--json",
    ];
    args.extend_from_slice(tls);
    hourglass(&args, b"")
}

#[test]
fn mutual_tls_end_to_end_and_every_wrong_credential_refused() {
    let dir = TempDir::new("tls");
    let ca = Ca::new(&dir, "ca");
    let other = Ca::new(&dir, "other");
    let (server_cert, server_key) = ca.issue(&dir, "server", false, false);
    let (client_cert, client_key) = ca.issue(&dir, "client", true, false);
    let (stranger_cert, stranger_key) = other.issue(&dir, "stranger", true, false);
    let ca_pem = ca.pem(&dir);
    let agg = AggregatorProcess::start(
        &dir.file("agg"),
        &[
            "--tls-cert",
            &server_cert,
            "--tls-key",
            &server_key,
            "--tls-client-ca",
            &ca_pem,
        ],
    );
    assert!(
        agg.logs().contains("mutual TLS"),
        "the log says which mode: {}",
        agg.logs()
    );
    let url = https(&agg);

    // An agent shipping over mutual TLS, and taking events over TLS itself.
    let agent = AgentProcess::start(
        "web-1",
        &url,
        &dir.file("agent"),
        &[
            "--tls-ca",
            &ca_pem,
            "--tls-client-cert",
            &client_cert,
            "--tls-client-key",
            &client_key,
            "--tls-cert",
            &server_cert,
            "--tls-key",
            &server_key,
            "--flush-interval",
            "200ms",
        ],
    );
    let ingest = agent.ingest.replacen("http://", "https://", 1);
    let sent = hourglass(
        &[
            "send", "--agent", &ingest, "--tls-ca", &ca_pem, "visitors", "a", "b", "c",
        ],
        b"",
    );
    assert!(sent.status.success(), "send over TLS: {}", sent.stderr);
    // A plaintext client gets nowhere on a TLS port.
    let plain = hourglass(&["send", "--agent", &agent.ingest, "visitors", "x"], b"");
    assert!(!plain.status.success());

    let good = [
        "--tls-ca",
        ca_pem.as_str(),
        "--tls-client-cert",
        client_cert.as_str(),
        "--tls-client-key",
        client_key.as_str(),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let run = query(&url, &good);
        if run.status.success() && run.json()["estimate"].as_f64().map(f64::round) == Some(3.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never visible over mutual TLS: {} {}",
            run.text(),
            run.stderr
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // No client certificate, a certificate from another CA, and trusting the wrong CA.
    let refused: [(&str, Vec<&str>); 3] = [
        ("no client certificate", vec!["--tls-ca", ca_pem.as_str()]),
        (
            "a client certificate from another CA",
            vec![
                "--tls-ca",
                ca_pem.as_str(),
                "--tls-client-cert",
                stranger_cert.as_str(),
                "--tls-client-key",
                stranger_key.as_str(),
            ],
        ),
        ("the wrong CA for the server", {
            let other_pem: &'static str = Box::leak(other.pem(&dir).into_boxed_str());
            vec![
                "--tls-ca",
                other_pem,
                "--tls-client-cert",
                client_cert.as_str(),
                "--tls-client-key",
                client_key.as_str(),
            ]
        }),
    ];
    for (what, flags) in refused {
        let run = query(&url, &flags);
        assert!(!run.status.success(), "{what}: accepted: {}", run.text());
        assert!(run.stderr.contains("error"), "{what}: {}", run.stderr);
    }
    // Plaintext to a TLS port, and TLS flags on a plaintext URL: refused, saying why.
    let run = query(&agg.grpc, &[]);
    assert!(!run.status.success());
    let run = query(&agg.grpc, &["--tls-ca", &ca_pem]);
    assert!(run.stderr.contains("use an https:// URL"), "{}", run.stderr);
}

#[test]
fn expired_certificates_are_refused_and_renewed_ones_load_without_a_restart() {
    let dir = TempDir::new("tls-renew");
    let ca = Ca::new(&dir, "ca");
    let (expired_cert, expired_key) = ca.issue(&dir, "expired", false, true);
    let ca_pem = ca.pem(&dir);
    // The server's files are copies that the test later overwrites, as a renewal would.
    let (cert, key) = (dir.file("live.pem"), dir.file("live.key"));
    std::fs::copy(&expired_cert, &cert).unwrap();
    std::fs::copy(&expired_key, &key).unwrap();
    let agg = AggregatorProcess::start(&dir.file("agg"), &["--tls-cert", &cert, "--tls-key", &key]);
    let url = https(&agg);
    let run = query(&url, &["--tls-ca", &ca_pem]);
    assert!(
        !run.status.success(),
        "an expired server certificate was accepted"
    );
    assert!(
        run.stderr.to_lowercase().contains("expired") || run.stderr.contains("error"),
        "{}",
        run.stderr
    );

    // Renewal: new files in place; the running server picks them up.
    let (fresh_cert, fresh_key) = ca.issue(&dir, "fresh", false, false);
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::copy(&fresh_key, &key).unwrap();
    std::fs::copy(&fresh_cert, &cert).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let run = query(&url, &["--tls-ca", &ca_pem]);
        // The metric is unknown to a fresh aggregator: a clean "answered" error means the
        // TLS handshake succeeded.
        if run.status.success() || run.stderr.contains("the aggregator answered") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the renewed certificate never took effect: {}",
            run.stderr
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        agg.logs().contains("TLS certificate reloaded"),
        "{}",
        agg.logs()
    );
}

/// A push of one sketch as `server`, with `token` if any.
async fn push_as(url: &str, server: &str, token: Option<&str>) -> Result<(), tonic::Status> {
    use hourglass_rpc::proto::v1;
    let channel = tonic::transport::Channel::from_shared(url.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = v1::collector_client::CollectorClient::new(channel);
    let mut request = tonic::Request::new(crate::util::one_item_push(server, "visitors", b"x"));
    if let Some(t) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    client.push(request).await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_bind_roles_and_servers() {
    let dir = TempDir::new("tokens");
    let agent_token = "agent-secret-token-0123456789";
    let query_token = "query-secret-token-0123456789";
    std::fs::write(dir.file("agent.token"), format!("{agent_token}\n")).unwrap();
    std::fs::write(dir.file("query.token"), query_token).unwrap();
    let config = dir.file("agg.toml");
    std::fs::write(
        &config,
        format!(
            "[[auth.tokens]]\nname = \"web-agents\"\nrole = \"agent\"\nservers = [\"web-*\"]\nfile = \"{}\"\n\n[[auth.tokens]]\nname = \"dashboards\"\nrole = \"query\"\nfile = \"{}\"\n",
            dir.file("agent.token"),
            dir.file("query.token")
        ),
    )
    .unwrap();
    let agg = AggregatorProcess::start(&dir.file("agg"), &["--config", &config]);

    // Pushes: no token, an unknown one, a query token, another server's name, then right.
    let e = push_as(&agg.grpc, "web-1", None).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let e = push_as(&agg.grpc, "web-1", Some("not-a-token-at-all-0000"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let e = push_as(&agg.grpc, "web-1", Some(query_token))
        .await
        .unwrap_err();
    assert_eq!(
        e.code(),
        tonic::Code::PermissionDenied,
        "a query token cannot push: {e:?}"
    );
    let e = push_as(&agg.grpc, "db-1", Some(agent_token))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(
        e.message().contains("\"db-1\"") && !e.message().contains(agent_token),
        "{}",
        e.message()
    );
    push_as(&agg.grpc, "web-1", Some(agent_token))
        .await
        .expect("the right token pushes");

    // A real agent with its token file ships; queries need the query token.
    let agent = AgentProcess::start(
        "web-2",
        &agg.grpc,
        &dir.file("agent"),
        &[
            "--token-file",
            &dir.file("agent.token"),
            "--flush-interval",
            "200ms",
        ],
    );
    hourglass(
        &["send", "--agent", &agent.ingest, "visitors", "a", "b"],
        b"",
    )
    .ok();
    let run = query(&agg.grpc, &[]);
    assert!(
        !run.status.success() && run.stderr.contains("needs a token"),
        "{}",
        run.stderr
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let run = query(&agg.grpc, &["--token-file", &dir.file("query.token")]);
        // web-1's one item and web-2's two.
        if run.status.success() && run.json()["estimate"].as_f64().map(f64::round) == Some(3.0) {
            break;
        }
        assert!(Instant::now() < deadline, "{} {}", run.text(), run.stderr);
        std::thread::sleep(Duration::from_millis(100));
    }
    let run = query(&agg.grpc, &["--token-file", &dir.file("agent.token")]);
    assert!(
        !run.status.success() && run.stderr.contains("may not call Query"),
        "{}",
        run.stderr
    );
    for secret in [agent_token, query_token] {
        assert!(
            !agg.logs().contains(secret),
            "a token value reached the log"
        );
        assert!(
            !agent.logs().contains(secret),
            "a token value reached the agent's log"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn under_mutual_tls_a_client_certificate_stands_in_for_a_token() {
    let dir = TempDir::new("cert-auth");
    let ca = Ca::new(&dir, "ca");
    let (server_cert, server_key) = ca.issue(&dir, "server", false, false);
    // The certificate's common name is its file name: "db-agents".
    let (client_cert, client_key) = ca.issue(&dir, "db-agents", true, false);
    let (unknown_cert, unknown_key) = ca.issue(&dir, "somebody-else", true, false);
    let ca_pem = ca.pem(&dir);
    let config = dir.file("agg.toml");
    std::fs::write(
        &config,
        "[[auth.tokens]]\nname = \"db agents\"\nrole = \"agent\"\nservers = [\"db-*\"]\nclient_cert_cn = \"db-agents\"\n",
    )
    .unwrap();
    let agg = AggregatorProcess::start(
        &dir.file("agg"),
        &[
            "--tls-cert",
            &server_cert,
            "--tls-key",
            &server_key,
            "--tls-client-ca",
            &ca_pem,
            "--config",
            &config,
        ],
    );
    let url = https(&agg);
    let push = |cert: String, key: String, server: &'static str| {
        let (url, ca_pem) = (url.clone(), ca_pem.clone());
        async move {
            use hourglass_rpc::proto::v1;
            let tls = hourglass_rpc::tls::ClientTls {
                ca: Some(ca_pem.into()),
                cert: Some(cert.into()),
                key: Some(key.into()),
            };
            let channel = tls.endpoint(&url).unwrap().connect().await.unwrap();
            v1::collector_client::CollectorClient::new(channel)
                .push(crate::util::one_item_push(server, "visitors", b"x"))
                .await
                .map(|_| ())
        }
    };
    push(client_cert.clone(), client_key.clone(), "db-1")
        .await
        .expect("the certificate's entry may push as db-*");
    let e = push(client_cert.clone(), client_key.clone(), "web-1")
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let e = push(unknown_cert, unknown_key, "db-1").await.unwrap_err();
    assert_eq!(
        e.code(),
        tonic::Code::Unauthenticated,
        "a valid certificate no entry names: {e:?}"
    );
    // The agent certificate cannot query.
    let run = query(
        &url,
        &[
            "--tls-ca",
            &ca_pem,
            "--tls-client-cert",
            &client_cert,
            "--tls-client-key",
            &client_key,
        ],
    );
    assert!(run.stderr.contains("may not call Query"), "{}", run.stderr);
}

/// Cluster mode over mutual TLS: two nodes with one owner per partition, so that a push's
/// answer (held versions) or a query (partial merges) crosses between them; each node
/// presents its serving certificate (server and client authentication) to the other
/// (`peer_ca_file`, `peer_cert_file`, `peer_key_file`). Both answer the same, through
/// either node.
#[test]
fn cluster_nodes_call_each_other_over_mutual_tls() {
    let nats = NatsCluster::start(3);
    let dir = TempDir::new("tls-cluster");
    let ca = Ca::new(&dir, "ca");
    let usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let (cert, key) = ca.issue_for(&dir, "node", usages, false);
    let (client_cert, client_key) = ca.issue(&dir, "client", true, false);
    let ca_pem = ca.pem(&dir);
    let urls: Vec<String> = nats.urls().iter().map(|u| format!("{u:?}")).collect();
    let start = |node: &str| {
        let config = dir.file(&format!("{node}.toml"));
        std::fs::write(
            &config,
            format!(
                "[cluster]\nnode = \"{node}\"\nnats = [{}]\npartitions = 8\nowners = 1\n\
                 heartbeat = \"500ms\"\nmember_ttl = \"6s\"\npeer_ca_file = {ca_pem:?}\n\
                 peer_cert_file = {cert:?}\npeer_key_file = {key:?}\n",
                urls.join(", ")
            ),
        )
        .unwrap();
        AggregatorProcess::start(
            &dir.file(node),
            &[
                "--config",
                &config,
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
                "--tls-client-ca",
                &ca_pem,
            ],
        )
    };
    let (a, b) = (start("agg-1"), start("agg-2"));
    wait_until_within(
        "two members, each ready for what it owns",
        JOIN_WAIT,
        || {
            [&a, &b].iter().all(|n| {
                let applying = agg_metric(*n, "cluster_partitions_applying");
                agg_metric(*n, "cluster_members") == 2.0
                    && applying > 0.0
                    && agg_metric(*n, "cluster_partitions_ready") == applying
            })
        },
    );
    // One owner per partition once the hand-over is over: each node answers for only
    // part of them and must call the other for the rest.
    wait_until_within("each partition applied by its one owner", JOIN_WAIT, || {
        agg_metric(&a, "cluster_partitions_applying")
            + agg_metric(&b, "cluster_partitions_applying")
            == 8.0
    });
    let tls = [
        "--tls-ca",
        ca_pem.as_str(),
        "--tls-client-cert",
        client_cert.as_str(),
        "--tls-client-key",
        client_key.as_str(),
    ];
    // Ten series: with one owner each, some are bound to be owned by the other node.
    let agent = AgentProcess::start(
        "web-1",
        &https(&a),
        &dir.file("agent"),
        &[
            "--tls-ca",
            &ca_pem,
            "--tls-client-cert",
            &client_cert,
            "--tls-client-key",
            &client_key,
            "--flush-interval",
            "200ms",
        ],
    );
    for i in 0..10 {
        let page = format!("page=p{i}");
        let sent = hourglass(
            &[
                "send",
                "--agent",
                &agent.ingest,
                "visitors",
                "a",
                "b",
                "c",
                "--tag",
                &page,
            ],
            b"",
        );
        assert!(sent.status.success(), "send: {}", sent.stderr);
    }
    for node in [&a, &b] {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let run = query(&https(node), &tls);
            if run.status.success()
                && run.json()["estimate"].as_f64().map(f64::round) == Some(3.0)
                && run.json()["partitions_missing"].as_u64().unwrap_or(0) == 0
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} never answers over mutual TLS between the nodes: {} {}\n{}",
                node.grpc,
                run.text(),
                run.stderr,
                node.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
