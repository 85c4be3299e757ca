//! A set of manifests checked together (what `kectl validate` and edgecore's manifests directory
//! use): every Device and DeviceModel, devices against their models when the model is among the
//! files, and the objects that are valid.

use crate::manifest::{self, Object};
use crate::paths::DeviceId;
use crate::v1beta1::{Device, DeviceModel, namespace_of};
use crate::validate::{Problem, validate_config_data, validate_device, validate_model};
use std::collections::{HashMap, HashSet};
use std::fmt;

/// One problem, located in a file and an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub file: String,
    /// Position of the document in its file, from 0; findings are sorted by file and document.
    pub document: usize,
    /// `KIND NAME`, or `KIND #N` (N counting documents from 1) where the name is unknown.
    pub object: String,
    pub problem: Problem,
}

impl Finding {
    fn new(file: &str, document: usize, object: &str, problem: Problem) -> Self {
        Self {
            file: file.to_string(),
            document,
            object: object.to_string(),
            problem,
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.file, self.object, self.problem)
    }
}

/// What `kectl validate` found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub findings: Vec<Finding>,
    /// Objects read (documents that were not empty).
    pub objects: usize,
    /// The models with no error, in file order.
    pub valid_models: Vec<DeviceModel>,
    /// The devices with no error, in file order.
    pub valid_devices: Vec<Device>,
    /// Every device a document declares, valid or not, with its file: `(file, namespace/name)`.
    pub declared_devices: Vec<(String, DeviceId)>,
    /// Files with a document that could not be parsed into any object.
    pub unparsed_files: Vec<String>,
}

impl Report {
    /// Errors (not warnings) found.
    pub fn errors(&self) -> usize {
        self.findings
            .iter()
            .filter(|f| f.problem.is_error())
            .count()
    }

    /// Warnings found.
    pub fn warnings(&self) -> usize {
        self.findings.len() - self.errors()
    }

    /// Whether every object is valid (warnings allowed).
    pub fn is_valid(&self) -> bool {
        self.errors() == 0
    }
}

fn label(kind: &str, name: &str, index: usize) -> String {
    let kind = if kind.is_empty() { "document" } else { kind };
    if name.is_empty() {
        format!("{kind} #{}", index + 1)
    } else {
        format!("{kind} {name}")
    }
}

/// Validates manifests given as `(file name, text)` pairs. File names only label findings.
pub fn validate_texts(inputs: &[(String, String)]) -> Report {
    let mut report = Report::default();
    let mut models: HashMap<(String, String), DeviceModel> = HashMap::new();
    let mut devices: Vec<(usize, usize, String, Device, bool)> = Vec::new();
    let mut seen: HashMap<(String, String, String), String> = HashMap::new();
    let mut findings: Vec<(usize, Finding)> = Vec::new();
    let mut model_docs: Vec<((usize, usize), DeviceModel)> = Vec::new();
    let mut device_docs: Vec<((usize, usize), Device)> = Vec::new();
    for (file_index, (file, text)) in inputs.iter().enumerate() {
        let mut push = |document: usize, object: &str, problem: Problem| {
            findings.push((file_index, Finding::new(file, document, object, problem)));
        };
        let docs = manifest::parse_documents(text);
        if docs.is_empty() {
            push(0, "file", Problem::warning("", "no objects in this file"));
        }
        for doc in docs {
            report.objects += 1;
            let object_label = label(&doc.kind, &doc.name, doc.index);
            for problem in doc.problems {
                push(doc.index, &object_label, problem);
            }
            let complete = doc.object.is_some();
            let Some(object) = doc.object.or(doc.partial) else {
                if !report.unparsed_files.contains(file) {
                    report.unparsed_files.push(file.clone());
                }
                continue;
            };
            let ns = namespace_of(match &object {
                Object::Device(d) => &d.metadata,
                Object::DeviceModel(m) => &m.metadata,
                Object::DeviceStatus(s) => &s.metadata,
            });
            let key = (
                object.kind().to_string(),
                ns.clone(),
                object.name().to_string(),
            );
            if let Some(first) = seen.get(&key) {
                let message = format!(
                    "{} {ns}/{} is defined twice (first in {first})",
                    key.0, key.2
                );
                push(
                    doc.index,
                    &object_label,
                    Problem::error("metadata.name", message),
                );
            } else {
                seen.insert(key, file.clone());
            }
            match object {
                Object::DeviceModel(m) => {
                    for problem in validate_model(&m) {
                        push(doc.index, &object_label, problem);
                    }
                    let name = m.metadata.name.clone().unwrap_or_default();
                    if complete {
                        model_docs.push(((file_index, doc.index), (*m).clone()));
                    }
                    models.entry((ns, name)).or_insert(*m);
                }
                Object::Device(d) => {
                    let name = d.metadata.name.clone().unwrap_or_default();
                    report
                        .declared_devices
                        .push((file.clone(), DeviceId::new(ns, name)));
                    devices.push((file_index, doc.index, object_label, *d, complete))
                }
                Object::DeviceStatus(_) => {}
            }
        }
    }
    let mut config_findings = Vec::new();
    // Bad alarm rules fail the check but hold back no device (the gateway shows them).
    let mut alarm_findings = Vec::new();
    for (file_index, document, object_label, device, complete) in devices {
        let file = &inputs[file_index].0;
        let ns = namespace_of(&device.metadata);
        let model = device
            .model_name()
            .and_then(|m| models.get(&(ns.clone(), m.to_string())));
        if let (Some(name), None) = (device.model_name(), model) {
            let problem = Problem::warning(
                "spec.deviceModelRef.name",
                format!(
                    "model {ns}/{name} is not among the given files; checks against it were skipped"
                ),
            );
            findings.push((
                file_index,
                Finding::new(file, document, &object_label, problem),
            ));
        }
        for problem in validate_device(&device, model) {
            findings.push((
                file_index,
                Finding::new(file, document, &object_label, problem),
            ));
        }
        // The mapper's own keys: an error (a misspelled register, a value out of range) makes
        // the document invalid here too, so that edgecore skips the device that its mapper
        // would refuse (one verdict for both); an unknown key is a warning.
        for problem in crate::alarm::problems(&device, model) {
            alarm_findings.push((
                file_index,
                Finding::new(file, document, &object_label, problem),
            ));
        }
        for problem in validate_config_data(&device, model) {
            config_findings.push((
                file_index,
                Finding::new(file, document, &object_label, problem),
            ));
        }
        if complete {
            device_docs.push(((file_index, document), device));
        }
    }
    // A desired value that cannot land is refused on its property by the twin (it holds back
    // nothing else there); every other error makes the document invalid.
    let bad: HashSet<(usize, usize)> = findings
        .iter()
        .chain(&config_findings)
        .filter(|(_, f)| f.problem.is_error() && !f.problem.is_about_desired())
        .map(|(file_index, f)| (*file_index, f.document))
        .collect();
    findings.extend(config_findings);
    findings.extend(alarm_findings);
    report.valid_models = model_docs
        .into_iter()
        .filter(|(at, _)| !bad.contains(at))
        .map(|(_, m)| m)
        .collect();
    report.valid_devices = device_docs
        .into_iter()
        .filter(|(at, _)| !bad.contains(at))
        .map(|(_, d)| d)
        .collect();
    // Stable: within one document, schema problems first, then the semantic ones.
    findings.sort_by_key(|(file_index, f)| (*file_index, f.document));
    report.findings = findings.into_iter().map(|(_, f)| f).collect();
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: &str = r#"
apiVersion: devices.kubeedge.io/v1beta1
kind: DeviceModel
metadata: {name: m, namespace: default}
spec:
  protocol: modbus
  properties:
    - name: t
      type: INT
      accessMode: ReadOnly
      visitors: {protocolName: modbus, configData: {register: InputRegister, limit: 1}}
"#;

    fn device(visitor: &str) -> String {
        format!(
            r#"---
apiVersion: devices.kubeedge.io/v1beta1
kind: Device
metadata: {{name: d, namespace: default}}
spec:
  deviceModelRef: {{name: m}}
  protocol: {{protocolName: modbus, configData: {{ip: 127.0.0.1}}}}
  properties:
    - {{name: t, visitors: {{protocolName: modbus, configData: {visitor}}}}}
"#
        )
    }

    fn report(visitor: &str) -> Report {
        validate_texts(&[("f.yaml".into(), format!("{MODEL}{}", device(visitor)))])
    }

    /// One verdict with the mapper: a configData error skips the device (the mapper would
    /// refuse it), judged on what the mapper gets, the model's visitor under the device's.
    #[test]
    fn config_data_errors_make_the_device_invalid_on_the_merged_visitor() {
        let r = report("{offset: 4}");
        assert_eq!(r.errors(), 0, "the register comes from the model");
        assert_eq!(r.valid_devices.len(), 1);
        let r = report("{register: HoldingRegisters, offset: 4}");
        assert_eq!(r.valid_devices.len(), 0);
        assert!(
            r.findings
                .iter()
                .any(|f| f.to_string().contains("\"HoldingRegisters\" is not one of")),
            "{:?}",
            r.findings.iter().map(|f| f.to_string()).collect::<Vec<_>>()
        );
        // An unknown key is a warning: the device is loaded.
        let r = report("{offset: 4, serialNumber: 7}");
        assert_eq!((r.errors(), r.valid_devices.len()), (0, 1));
    }
}
