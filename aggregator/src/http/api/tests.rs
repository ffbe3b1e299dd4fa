//! The API's query strings and the JSON shapes of its answers.

use axum::http::StatusCode;

use super::ROUTES;
use super::params::Params;
use crate::auth::Auth;
use crate::http::tests::{app, get_json, stocked};

#[tokio::test]
async fn answers_have_the_documented_shape() {
    let app = app(stocked(), Auth::default());
    // 1970-01-05T04:00Z is hour 100.
    let range = "from=1970-01-05T04:00:00Z&to=1970-01-05T06:00:00Z";
    let (status, v) = get_json(
        &app,
        &format!("/api/v1/distinct?metric=visitors&{range}&group_by=hour"),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["metric"], "visitors");
    assert_eq!(
        v["range"],
        serde_json::json!({"from": "1970-01-05T04:00:00Z", "to": "1970-01-05T06:00:00Z", "start_hour": 100, "end_hour": 102})
    );
    assert_eq!(v["coverage"]["sketches_merged"], 3);
    assert!(v["answer"]["estimate"].as_f64().unwrap() > 2.5);
    let groups = v["groups"].as_array().unwrap();
    let times: Vec<&str> = groups.iter().map(|g| g["time"].as_str().unwrap()).collect();
    assert_eq!(times, ["1970-01-05T04:00:00Z", "1970-01-05T05:00:00Z"]);
    assert_eq!(groups[0]["key"], "1970-01-05T04:00Z");
    assert_eq!(groups[1]["coverage"]["sketches_merged"], 2);

    let (_, v) = get_json(
        &app,
        &format!("/api/v1/distinct?metric=visitors&{range}&group_by=server"),
        &[],
    )
    .await;
    assert_eq!(v["groups"][0]["key"], "web-1");
    assert!(
        v["groups"][0].get("time").is_none(),
        "only hours and days have a time"
    );
    let (_, v) = get_json(
        &app,
        &format!("/api/v1/distinct?metric=visitors&{range}"),
        &[],
    )
    .await;
    assert_eq!(v["groups"], serde_json::json!([]), "groups is always there");

    let (status, v) = get_json(
        &app,
        &format!("/api/v1/frequency?metric=pages&{range}&item=%2Fcart"),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["item"], "/cart");
    assert_eq!(v["answer"]["estimate"], 3);
    let (_, v) = get_json(
        &app,
        &format!("/api/v1/frequency?metric=pages&{range}&item=%FF"),
        &[],
    )
    .await;
    assert_eq!(v["item_base64"], "/w==", "not UTF-8: {v}");
    assert!(v.get("item").is_none());
    let (_, v) = get_json(&app, &format!("/api/v1/topk?metric=pages&{range}&k=1"), &[]).await;
    assert_eq!(v["k"], 1);
    assert_eq!(v["items"][0]["item"], "/cart");
    assert_eq!(v["items"][0]["estimate"], 3);

    let (_, v) = get_json(&app, "/api/v1/series", &[]).await;
    assert_eq!(
        v["series"],
        serde_json::json!([
            {"metric": "pages", "tags": {}, "kind": "frequency"},
            {"metric": "visitors", "tags": {}, "kind": "distinct"},
        ])
    );
    let (_, v) = get_json(&app, "/api/v1/series?metric=pages", &[]).await;
    assert_eq!(v["series"].as_array().unwrap().len(), 1);
    let (_, v) = get_json(&app, "/api/v1/servers", &[]).await;
    assert_eq!(v["servers"][1]["name"], "web-2");
    assert_eq!(
        v["servers"][1]["labels"],
        serde_json::json!({"region": "eu"})
    );
}

#[test]
fn query_strings_decode_to_bytes() {
    let route = ROUTES[1]; // frequency
    let p = Params::parse(Some("metric=a&item=%FF%2B+x&tag=k%3Dv&tag=j=w"), route).unwrap();
    let s = format!("{p:?}");
    assert!(s.contains("[255, 43, 32, 120]"), "{s}");
    assert!(Params::parse(Some("&&metric=a&"), route).is_ok());
    assert!(Params::parse(Some("%FF=1"), route).is_err());
    assert!(Params::parse(Some("item=a&item=b"), route).is_err());
}

#[tokio::test]
async fn only_the_batch_route_takes_item_more_than_once() {
    let route = |path: &str| *ROUTES.iter().find(|r| r.path == path).unwrap();
    for (path, says) in [
        (
            "/api/v1/membership",
            "/api/v1/membership asks about one item (/api/v1/membership/batch looks up many)",
        ),
        ("/api/v1/frequency", "/api/v1/frequency asks about one item"),
    ] {
        // Refused as the query string is read, as any other parameter given twice.
        let e = Params::parse(Some("metric=a&item=x&item=y"), route(path)).unwrap_err();
        let e = format!("{e:?}");
        assert!(e.contains(says), "{path}: {e}");
        // There is no batch of frequencies to point at.
        if path == "/api/v1/frequency" {
            assert!(!e.contains("batch"), "{path}: {e}");
        }
        // Over HTTP: 400, before the selection is read.
        let app = app(stocked(), Auth::default());
        let (status, v) = get_json(&app, &format!("{path}?metric=9x&item=x&item=y"), &[]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{path}: {message}");
    }
    let batch = route("/api/v1/membership/batch");
    let p = Params::parse(Some("metric=a&item=x&item=%FF&item="), batch).unwrap();
    assert_eq!(p.items(), [b"x".to_vec(), vec![0xff], vec![]]);
}
