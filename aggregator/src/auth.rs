//! Who may do what: bearer tokens mapped to roles (DESIGN §8).
//!
//! The config file lists tokens by name; each token's value comes from a file or an
//! environment variable, never from the command line or the config itself:
//!
//! ```toml
//! [[auth.tokens]]
//! name = "web-agents"                    # shown in logs and errors; the value never is
//! role = "agent"                         # agent | query | admin
//! servers = ["web-*"]                    # agent: the server names (globs) it may push as
//! file = "/run/secrets/web-agents-token" # or: env = "HOURGLASS_TOKEN_WEB_AGENTS"
//!
//! [[auth.tokens]]                        # under mutual TLS a client certificate can
//! name = "db-agents"                     # stand in for a token: the common name of its
//! role = "agent"                         # subject picks the entry
//! servers = ["db-*"]
//! client_cert_cn = "db-agents"
//! ```
//!
//! With no tokens configured, every caller may do everything (loopback development), and
//! the log says so. With tokens, every Collector and Query call needs `authorization:
//! Bearer TOKEN`: a missing or unknown token gets UNAUTHENTICATED; a token whose role does
//! not allow the call, or an agent token pushing for a server its globs do not cover,
//! gets PERMISSION_DENIED naming the role or the server. Health and reflection stay open
//! for probes. Tokens are compared in constant time.

use std::sync::Arc;

use serde::Deserialize;
use tonic::{Request, Status};

/// What a token allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Role {
    /// Push, as the servers its globs cover.
    Agent,
    /// Query.
    Query,
    /// Everything.
    Admin,
}

/// `[[auth.tokens]]`: one token.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TokenConfig {
    /// A name for logs and errors.
    pub(crate) name: String,
    /// What it allows.
    pub(crate) role: Role,
    /// For `agent`: server name globs it may push as.
    #[serde(default)]
    pub(crate) servers: Vec<String>,
    /// A file holding the token (surrounding whitespace ignored).
    pub(crate) file: Option<std::path::PathBuf>,
    /// An environment variable holding the token.
    pub(crate) env: Option<String>,
    /// Under mutual TLS: the common name of the client certificate that stands in for
    /// the token.
    pub(crate) client_cert_cn: Option<String>,
}

/// `[auth]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// The tokens; none means no authentication.
    pub(crate) tokens: Vec<TokenConfig>,
}

/// The caller a token identified, put on the request for the services.
#[derive(Debug, Clone)]
pub(crate) struct Principal {
    /// The token's name.
    pub(crate) name: String,
    /// Its role.
    pub(crate) role: Role,
    /// For agents: the server globs it may push as.
    pub(crate) servers: Vec<String>,
}

impl Principal {
    /// Whether it may push as `server`; the error names the token and the server.
    pub(crate) fn may_push_as(&self, server: &str) -> Result<(), Status> {
        match self.role {
            Role::Admin => Ok(()),
            Role::Agent if self.servers.iter().any(|g| crate::glob::matches(g, server)) => Ok(()),
            _ => Err(Status::permission_denied(format!(
                "token {:?} may not push as server {server:?}",
                self.name
            ))),
        }
    }
}

struct Token {
    value: Vec<u8>,
    principal: Principal,
}

/// The loaded tokens.
#[derive(Clone, Default)]
pub struct Auth {
    tokens: Arc<Vec<Token>>,
    certificates: Arc<Vec<(String, Principal)>>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names only: a token's value never reaches a log.
        let names: Vec<&str> = self
            .tokens
            .iter()
            .map(|t| t.principal.name.as_str())
            .chain(self.certificates.iter().map(|(_, p)| p.name.as_str()))
            .collect();
        f.debug_struct("Auth").field("tokens", &names).finish()
    }
}

/// Which service a call belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Service {
    /// Collector: agents and admins.
    Collector,
    /// Query: queriers and admins.
    Query,
}

/// Equal in constant time for equal lengths (the length of a token is not a secret worth
/// guarding: it is fixed by whoever makes tokens).
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A token of `[auth]` that cannot be used: names the token and what is wrong with it,
/// never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("auth token {token:?}: {problem}")]
pub struct AuthError {
    /// The token's name.
    pub(crate) token: String,
    /// What is wrong.
    pub(crate) problem: String,
}

impl AuthError {
    fn new(token: &str, problem: impl Into<String>) -> AuthError {
        AuthError {
            token: token.to_string(),
            problem: problem.into(),
        }
    }
}

impl Auth {
    /// Reads every token's value; an error names the token and the source, never the value.
    pub fn load(config: &AuthConfig) -> Result<Auth, AuthError> {
        let mut tokens: Vec<Token> = Vec::new();
        let mut certificates = Vec::new();
        for t in &config.tokens {
            if t.role == Role::Agent && t.servers.is_empty() {
                return Err(AuthError::new(
                    &t.name,
                    "an agent token needs servers (globs it may push as)",
                ));
            }
            let principal = Principal {
                name: t.name.clone(),
                role: t.role,
                servers: t.servers.clone(),
            };
            let value = match (&t.file, &t.env, &t.client_cert_cn) {
                (Some(path), None, None) => std::fs::read_to_string(path).map_err(|e| {
                    AuthError::new(&t.name, format!("cannot read {}: {e}", path.display()))
                })?,
                (None, Some(var), None) => std::env::var(var).map_err(|_| {
                    AuthError::new(&t.name, format!("environment variable {var} is not set"))
                })?,
                (None, None, Some(cn)) => {
                    certificates.push((cn.clone(), principal));
                    continue;
                }
                _ => {
                    return Err(AuthError::new(
                        &t.name,
                        "give exactly one of file, env and client_cert_cn",
                    ));
                }
            };
            let value = value.trim().as_bytes().to_vec();
            if value.len() < 16 {
                return Err(AuthError::new(
                    &t.name,
                    "shorter than 16 bytes; use a long random token",
                ));
            }
            if tokens.iter().any(|k| same(&k.value, &value)) {
                return Err(AuthError::new(&t.name, "the same value as another token"));
            }
            tokens.push(Token { value, principal });
        }
        Ok(Auth {
            tokens: Arc::new(tokens),
            certificates: Arc::new(certificates),
        })
    }

    /// Whether callers must identify themselves.
    pub fn enabled(&self) -> bool {
        !self.tokens.is_empty() || !self.certificates.is_empty()
    }

    /// The principal a verified client certificate stands for, by its subject's common
    /// name. The TLS layer has verified the chain against the client CA already.
    fn by_certificate(&self, request: &Request<()>) -> Option<&Principal> {
        let certs = request.peer_certs()?;
        let leaf = certs.first()?;
        let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
        let cn = cert.subject().iter_common_name().next()?.as_str().ok()?;
        self.certificates
            .iter()
            .find(|(name, _)| name == cn)
            .map(|(_, p)| p)
    }

    /// Checks a call's token against `service`; on success the request carries the
    /// [`Principal`].
    pub(crate) fn check(
        &self,
        service: Service,
        mut request: Request<()>,
    ) -> Result<Request<()>, Status> {
        if !self.enabled() {
            return Ok(request);
        }
        let principal = match request.metadata().get("authorization") {
            Some(header) => {
                let given = hourglass_rpc::tls::bearer_token(header.as_bytes()).ok_or_else(|| {
                    Status::unauthenticated("the authorization header must be \"Bearer TOKEN\"")
                })?;
                // Every token is compared, whichever matches, so timing says nothing.
                let mut found = None;
                for token in self.tokens.iter() {
                    if same(&token.value, given) {
                        found = Some(&token.principal);
                    }
                }
                found.ok_or_else(|| Status::unauthenticated("unknown token"))?
            }
            None => self.by_certificate(&request).ok_or_else(|| {
                Status::unauthenticated(
                    "this aggregator needs a token (authorization: Bearer TOKEN) or a client certificate it knows",
                )
            })?,
        };
        let principal = principal.clone();
        let allowed = matches!(
            (service, principal.role),
            (_, Role::Admin) | (Service::Collector, Role::Agent) | (Service::Query, Role::Query)
        );
        if !allowed {
            return Err(Status::permission_denied(format!(
                "token {:?} has role {:?}, which may not call {service:?}",
                principal.name, principal.role
            )));
        }
        request.extensions_mut().insert(principal);
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(unsafe_code)] // set_var: see the SAFETY comment
    fn auth() -> Auth {
        let dir = std::env::temp_dir().join(format!("hourglass-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("agent"), "agent-token-0123456789\n").unwrap();
        // SAFETY: tests in this module set this variable only here, before reading it.
        unsafe { std::env::set_var("HOURGLASS_TEST_QUERY_TOKEN", "query-token-0123456789") };
        let config: AuthConfig = toml::from_str(&format!(
            "[[tokens]]\nname = \"web\"\nrole = \"agent\"\nservers = [\"web-*\"]\nfile = \"{}\"\n\n[[tokens]]\nname = \"dash\"\nrole = \"query\"\nenv = \"HOURGLASS_TEST_QUERY_TOKEN\"\n",
            dir.join("agent").display()
        ))
        .unwrap();
        Auth::load(&config).unwrap()
    }

    fn call(token: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(t) = token {
            r.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        r
    }

    #[test]
    fn roles_and_servers_are_enforced_and_values_never_shown() {
        let auth = auth();
        let e = auth.check(Service::Query, call(None)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        let e = auth
            .check(Service::Query, call(Some("guess-0123456789abc")))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        let ok = auth
            .check(Service::Collector, call(Some("agent-token-0123456789")))
            .unwrap();
        let principal = ok.extensions().get::<Principal>().unwrap();
        assert!(principal.may_push_as("web-7").is_ok());
        let e = principal.may_push_as("db-1").unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(
            e.message().contains("db-1") && !e.message().contains("agent-token"),
            "{}",
            e.message()
        );
        let e = auth
            .check(Service::Collector, call(Some("query-token-0123456789")))
            .unwrap_err();
        assert_eq!(
            e.code(),
            tonic::Code::PermissionDenied,
            "a query token cannot push"
        );
        assert!(
            auth.check(Service::Query, call(Some("query-token-0123456789")))
                .is_ok()
        );
        assert!(!format!("{auth:?}").contains("token-0123"), "{auth:?}");
        assert!(
            Auth::default()
                .check(Service::Collector, call(None))
                .is_ok(),
            "no tokens, no auth"
        );
    }

    #[test]
    fn bad_token_config_is_named_without_values() {
        let bad = |text: &str| {
            Auth::load(&toml::from_str(text).unwrap())
                .unwrap_err()
                .to_string()
        };
        assert!(
            bad("[[tokens]]\nname = \"x\"\nrole = \"query\"\n")
                .contains("exactly one of file, env and client_cert_cn")
        );
        assert!(
            bad(
                "[[tokens]]\nname = \"x\"\nrole = \"query\"\nenv = \"HOURGLASS_SURELY_UNSET_VAR\"\n"
            )
            .contains("not set")
        );
        assert!(same(b"abc", b"abc") && !same(b"abc", b"abd") && !same(b"abc", b"ab"));
    }
}
