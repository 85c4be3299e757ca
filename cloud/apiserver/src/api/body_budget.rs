use super::*;
use crate::store::StoreOptions;
use futures_util::FutureExt;

/// Bodies being handled share a budget of the largest body's size: one that does not fit
/// waits until the ones held are done, one that fits goes on.
#[tokio::test]
async fn large_bodies_wait_for_each_other_and_small_ones_go_on() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(
        &dir.path().join("api.db"),
        StoreOptions {
            history: 10,
            fsync: false,
            etcd: None,
        },
    )
    .await
    .expect("store");
    let api = Api::new(
        store,
        64 * 1024,
        "127.0.0.1:1".into(),
        Duration::from_secs(60),
        CancellationToken::new(),
    );
    let body = |kib: usize| Body::from(vec![b'x'; kib * 1024]);
    let (_, held) = api.collect(body(40)).await.expect("the first");
    let small = api.collect(body(20)).now_or_never();
    assert!(small.is_some(), "20 KiB beside 40 of 64 goes on");
    drop(small);
    let mut large = Box::pin(api.collect(body(40)));
    assert!(
        (&mut large).now_or_never().is_none(),
        "40 KiB beside 40 of 64 waits"
    );
    drop(held);
    let (raw, _) = large.await.expect("the second, once the first is done");
    assert_eq!(raw.len(), 40 * 1024);
}
