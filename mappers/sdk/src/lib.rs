//! The mapper SDK shared by every protocol mapper. Filled by the mapper issue; intentionally
//! empty until then.
