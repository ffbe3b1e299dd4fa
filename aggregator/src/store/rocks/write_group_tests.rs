//! `Replica::write_group` of a RocksStore: the thread-local flag that makes a group's writes
//! unsynced never outlives the group, nor reaches another thread.

use super::*;

fn store(dir: &Path) -> RocksStore {
    RocksStore::open(dir, &StoreOptions::default()).unwrap()
}

/// Whether a write on this thread now would be synced one by one ([`RocksStore::write`]).
fn writes_synced_here(store: &RocksStore) -> bool {
    store.sync_writes && !IN_WRITE_GROUP.get()
}

#[test]
fn a_panic_inside_a_write_group_leaves_later_writes_on_its_thread_synced() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    assert!(writes_synced_here(&store));
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        store.write_group(&mut || {
            assert!(!writes_synced_here(&store), "inside the group: unsynced");
            store.register_server("web-1", &[])?;
            panic!("a message's apply panics");
        })
    }));
    assert!(panicked.is_err());
    // The thread (a blocking-pool thread, reused for an agent's push) syncs again.
    assert!(writes_synced_here(&store));
    // And a group that returns an error ends too.
    let failed = store.write_group(&mut || Err(StoreError::Engine("refused".into())));
    assert!(matches!(failed, Err(StoreError::Engine(_))), "{failed:?}");
    assert!(writes_synced_here(&store));
    // What the panicking group wrote is there, and a later group syncs it with its own.
    store
        .write_group(&mut || store.register_server("web-2", &[]).map(drop))
        .unwrap();
    assert!(store.server_id("web-1").unwrap().is_some());
    assert!(store.server_id("web-2").unwrap().is_some());
}

#[test]
fn a_write_group_inside_a_write_group_ends_with_the_outer_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    store
        .write_group(&mut || {
            store.write_group(&mut || store.register_server("web-1", &[]).map(drop))?;
            // The inner group's end is not the outer's: still unsynced, synced at its end.
            assert!(!writes_synced_here(&store));
            // Even when the inner one panics.
            let inner = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                store.write_group(&mut || panic!("inner"))
            }));
            assert!(inner.is_err());
            assert!(!writes_synced_here(&store));
            Ok(())
        })
        .unwrap();
    assert!(writes_synced_here(&store));
}

#[test]
fn a_write_group_leaves_the_writes_of_other_threads_synced() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    store
        .write_group(&mut || {
            assert!(!writes_synced_here(&store));
            // Another thread (an agent's push on the blocking pool) meanwhile: synced.
            let other = std::thread::scope(|s| s.spawn(|| writes_synced_here(&store)).join());
            assert!(other.unwrap(), "another thread's write would be unsynced");
            Ok(())
        })
        .unwrap();
}

#[test]
fn a_write_group_without_sync_writes_leaves_writes_unsynced_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        sync_writes: false,
        ..StoreOptions::default()
    };
    let store = RocksStore::open(dir.path(), &options).unwrap();
    store
        .write_group(&mut || store.register_server("web-1", &[]).map(drop))
        .unwrap();
    assert!(!writes_synced_here(&store));
    assert!(!IN_WRITE_GROUP.get());
    drop(store);
    let store = RocksStore::open(dir.path(), &options).unwrap();
    assert!(store.server_id("web-1").unwrap().is_some());
}
