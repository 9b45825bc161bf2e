//! A headless Chromium for the dashboard's checks: Debian's chromium driven over WebDriver
//! (chromedriver, Debian's chromium-driver), as the dashboard tests and fleetgen's first-paint
//! measurement use it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Debian's chromium (or another Chromium where that is not installed).
pub fn chromium() -> PathBuf {
    for c in ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"] {
        if Path::new(c).exists() {
            return c.into();
        }
    }
    panic!("no chromium: scripts/setup.sh installs Debian's chromium for the dashboard tests");
}

/// A WebDriver session on chromedriver (Debian's chromium-driver), headless.
pub struct Browser {
    port: u16,
    session: String,
    driver: std::process::Child,
}

impl Browser {
    pub fn start() -> Browser {
        let port = crate::free_port();
        let driver = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver; scripts/setup.sh installs it)");
        crate::wait_for_port(port);
        let caps = serde_json::json!({"capabilities": {"alwaysMatch": {"goog:chromeOptions": {
            "binary": chromium().display().to_string(),
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--window-size=1400,1000"]}}}});
        let (code, body) = crate::http_json(port, "POST", "/session", &caps.to_string());
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        Browser { port, session: v["value"]["sessionId"].as_str().unwrap().to_owned(), driver }
    }

    pub fn call(&self, method: &str, path: &str, body: serde_json::Value) -> serde_json::Value {
        let body = if body.is_null() { String::new() } else { body.to_string() };
        let (code, out) = crate::http_json(self.port, method, &format!("/session/{}{path}", self.session), &body);
        assert_eq!(code, 200, "{method} {path}: {out}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["value"].clone()
    }

    pub fn go(&self, url: &str) {
        self.call("POST", "/url", serde_json::json!({ "url": url }));
    }

    /// Waits until `css` matches, then returns the element id.
    pub fn find(&self, css: &str) -> String {
        crate::wait::until(&format!("{css} on the page"), std::time::Duration::from_secs(40), || {
            let (code, out) = crate::http_json(
                self.port,
                "POST",
                &format!("/session/{}/element", self.session),
                &serde_json::json!({"using": "css selector", "value": css}).to_string(),
            );
            if code == 200 {
                let v: serde_json::Value = serde_json::from_str(&out).unwrap();
                Ok(v["value"].as_object().unwrap().values().next().unwrap().as_str().unwrap().to_owned())
            } else {
                Err(format!("{code} {out}"))
            }
        })
    }

    pub fn click(&self, css: &str) {
        let id = self.find(css);
        self.call("POST", &format!("/element/{id}/click"), serde_json::json!({}));
    }

    pub fn text(&self, css: &str) -> String {
        let id = self.find(css);
        self.call("GET", &format!("/element/{id}/text"), serde_json::Value::Null).as_str().unwrap().to_owned()
    }

    pub fn url(&self) -> String {
        self.call("GET", "/url", serde_json::Value::Null).as_str().unwrap().to_owned()
    }

    /// Runs `script` in the page and returns its result.
    pub fn execute(&self, script: &str) -> serde_json::Value {
        self.call("POST", "/execute/sync", serde_json::json!({ "script": script, "args": [] }))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = crate::http_json(self.port, "DELETE", &format!("/session/{}", self.session), "");
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
