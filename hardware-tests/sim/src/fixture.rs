//! The tests' manifests, kept as YAML files beside them (`hardware-tests/tests/manifests/`) so that
//! they read as an operator writes them and `kectl apply -f` takes them as they are: a `${name}`
//! mark stands for what only the running test knows (a port, a tty, an image).

use std::fmt::Display;

/// `template` with each `${name}` replaced by its value. A mark left without a value, or a value
/// no mark asks for, is a mistake in the test and panics naming it: a manifest that silently kept
/// `${port}` would fail far from the cause.
pub fn fill(template: &str, values: &[(&str, &dyn Display)]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut used = vec![false; values.len()];
    let mut rest = template;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            panic!("an unclosed ${{ in the manifest: {:?}", &rest[at..]);
        };
        let name = &after[..end];
        let Some(i) = values.iter().position(|(n, _)| *n == name) else {
            panic!("the manifest asks for ${{{name}}} and the test gives no value for it");
        };
        used[i] = true;
        out.push_str(&values[i].1.to_string());
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    if let Some(i) = used.iter().position(|u| !u) {
        panic!(
            "the test gives {} but the manifest has no ${{{}}}",
            values[i].0, values[i].0
        );
    }
    out
}

/// The manifest of the tests against a real device, whose protocol, `configData` and visitors the
/// operator gives as YAML flow mappings: model `model` with an INT `value` read through `read`
/// and, given `write`, an INT `target` written through it, on the device `device`.
pub struct RealDevice<'a> {
    pub protocol: &'a str,
    pub model: &'a str,
    pub device: &'a str,
    pub config: &'a str,
    pub read: &'a str,
    pub write: Option<&'a str>,
    pub cycle_ms: u32,
}

impl RealDevice<'_> {
    pub fn manifest(&self) -> String {
        let mut m = fill(
            include_str!("real_device.yaml"),
            &[
                ("model", &self.model),
                ("protocol", &self.protocol),
                ("device", &self.device),
                ("config", &self.config),
                ("cycle", &self.cycle_ms),
                ("read", &self.read),
            ],
        );
        if let Some(w) = self.write {
            m += &format!(
                "    - name: target\n      collectCycle: {}\n      visitors: {{protocolName: {}, configData: {w}}}\n",
                self.cycle_ms, self.protocol
            );
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::fill;

    #[test]
    fn every_mark_is_replaced_and_the_rest_kept() {
        let t = "port: ${port}\nip: ${ip}\nagain: ${port}\nbraces: {a: 1}\n";
        assert_eq!(
            fill(t, &[("port", &5020), ("ip", &"127.0.0.1")]),
            "port: 5020\nip: 127.0.0.1\nagain: 5020\nbraces: {a: 1}\n"
        );
    }

    #[test]
    #[should_panic(expected = "no value for it")]
    fn a_mark_without_a_value_is_a_mistake() {
        fill("port: ${port}", &[]);
    }

    #[test]
    #[should_panic(expected = "has no ${tty}")]
    fn a_value_without_a_mark_is_a_mistake() {
        fill("port: 1", &[("tty", &"/dev/x")]);
    }

    #[test]
    #[should_panic(expected = "unclosed")]
    fn an_unclosed_mark_is_a_mistake() {
        fill("port: ${port", &[("port", &1)]);
    }
}
