//! A run's outcomes as JUnit XML, for CI.

use super::*;

/// JUnit XML of a file that cannot be run: one test case, `the HIL file`, in error with `why`
/// (a CI that reads only JUnit sees the failure).
pub fn junit_error(suite: &str, why: &str) -> String {
    let mut report = quick_junit::Report::new("devsim-hil");
    let mut s = quick_junit::TestSuite::new(suite);
    let mut st = quick_junit::TestCaseStatus::non_success(quick_junit::NonSuccessKind::Error);
    st.set_message(why);
    s.add_test_case(quick_junit::TestCase::new("the HIL file", st));
    report.add_test_suite(s);
    report
        .to_string()
        .unwrap_or_else(|e| format!("<!-- cannot write the report: {e} -->"))
}

/// The outcomes as JUnit XML (one test suite, a test case per step).
pub fn junit(suite: &str, outcomes: &[Outcome]) -> String {
    let mut report = quick_junit::Report::new("devsim-hil");
    let mut s = quick_junit::TestSuite::new(suite);
    for o in outcomes {
        let status = match &o.failure {
            None if o.skipped => {
                let mut st = quick_junit::TestCaseStatus::skipped();
                st.set_message("not run: an earlier step failed");
                st
            }
            None => quick_junit::TestCaseStatus::success(),
            Some(f) => {
                let mut st =
                    quick_junit::TestCaseStatus::non_success(quick_junit::NonSuccessKind::Failure);
                st.set_message(f.clone());
                st
            }
        };
        let mut case = quick_junit::TestCase::new(o.name.clone(), status);
        case.set_time(o.took);
        s.add_test_case(case);
    }
    report.add_test_suite(s);
    report
        .to_string()
        .unwrap_or_else(|e| format!("<!-- cannot write the report: {e} -->"))
}
