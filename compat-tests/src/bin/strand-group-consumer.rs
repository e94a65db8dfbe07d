//! A consumer-group member in its own process, for the group tests: the rdkafka loop of
//! `strand_compat_tests::group::run_rdkafka_member`, reporting JSON lines on stdout, stopping at
//! EOF on stdin. Run in a child process so that a test can SIGKILL it: a crash that sends no
//! LeaveGroup. Usage: `strand-group-consumer '<MemberSpec as JSON>'`.

fn main() {
    std::process::exit(strand_compat_tests::group::child_main());
}
