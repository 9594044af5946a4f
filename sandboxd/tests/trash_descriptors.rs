//! The trash removes a tree with a bounded number of descriptors, whatever its depth: this
//! program makes a 2,000-level tree and runs itself again under `ulimit -n 16` to remove it. A
//! remover that kept one descriptor per level (or per level of a re-walk) fails with EMFILE a
//! dozen levels down. No libtest harness: the child is this same program, not a skipped test.

use std::os::fd::AsFd as _;
use std::path::Path;

use rustix::fs::{Mode, OFlags};

const CHILD: &str = "SANDBOXD_TRASH_TEST_TREE";
const DEPTH: usize = 2_000;
const OPEN_DIR: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

fn main() {
    match std::env::var_os(CHILD) {
        Some(tree) => remove_under_the_limit(Path::new(&tree)),
        None => {
            descriptors_stay_bounded();
            println!("trash_descriptors: 1 passed, 0 failed");
        }
    }
}

/// The child: removes the tree it was given, with whatever descriptors its limit allows.
fn remove_under_the_limit(tree: &Path) {
    let (Some(parent), Some(name)) = (tree.parent(), tree.file_name()) else {
        panic!("{} has no parent", tree.display());
    };
    let parent = rustix::fs::open(parent, OPEN_DIR, Mode::empty()).expect("open the parent");
    sandboxd::workspace::trash::remove_tree_at(parent.as_fd(), name)
        .expect("removed under the limit");
}

fn descriptors_stay_bounded() {
    let base = tempfile::tempdir().expect("tempdir");
    let tree = base.path().join("bounded");
    std::fs::create_dir(&tree).expect("mkdir top");
    let mut dir = rustix::fs::open(&tree, OPEN_DIR, Mode::empty()).expect("open top");
    for level in 0..DEPTH {
        if level % 500 == 0 {
            rustix::fs::openat(
                &dir,
                "f",
                OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC,
                Mode::RUSR | Mode::WUSR,
            )
            .expect("a file");
        }
        rustix::fs::mkdirat(&dir, "d", Mode::RWXU).expect("mkdir");
        dir = rustix::fs::openat(&dir, "d", OPEN_DIR, Mode::empty()).expect("open");
    }
    drop(dir);
    let exe = std::env::current_exe().expect("this program");
    // 16 descriptors in all, three of them stdio.
    let child = std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -n 16 && exec "$0""#)
        .arg(&exe)
        .env(CHILD, &tree)
        .output()
        .expect("the child runs");
    assert!(
        child.status.success(),
        "the removal under 16 descriptors failed: {}\n{}",
        String::from_utf8_lossy(&child.stdout),
        String::from_utf8_lossy(&child.stderr)
    );
    assert!(!tree.exists(), "the tree is gone");
}
