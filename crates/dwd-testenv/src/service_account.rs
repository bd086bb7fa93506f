//! Credentials of a ServiceAccount, as a pod running under it would get them.
//!
//! Tests that run a component with its shipped RBAC (the binary's own rules, the shadow's
//! manifests) need the token the kubelet would mount: a bound token from the TokenRequest API,
//! not an admin's certificate, so that what the RBAC forbids is really forbidden.

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};

use crate::{ApiServer, TestEnvError};

/// How long a requested token is valid: longer than any test, short like a pod's.
const TOKEN_SECONDS: i64 = 3600;

/// A one-hour token of the ServiceAccount `namespace/name` from the TokenRequest API.
pub async fn token(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<String, TestEnvError> {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(TOKEN_SECONDS),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let what = || format!("TokenRequest for {namespace}/{name}");
    let answer: TokenRequest = Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create_subresource("token", name, &PostParams::default(), &request)
        .await
        .map_err(|e| TestEnvError::Client(what(), e.to_string()))?;
    answer
        .status
        .map(|s| s.token)
        .ok_or_else(|| TestEnvError::Client(what(), "answer without status".into()))
}

/// A kubeconfig for `seed` (through its front door) with a [`token`] of the ServiceAccount
/// `namespace/name`: the credential a pod of that ServiceAccount gets.
pub async fn kubeconfig(
    seed: &ApiServer,
    admin: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<String, TestEnvError> {
    Ok(seed.kubeconfig_with_token(&token(admin, namespace, name).await?))
}
