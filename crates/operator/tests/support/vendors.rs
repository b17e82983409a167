//! In-process stand-ins for the vendors' GPU operators (issue 39): each
//! builds the test's device-plugin DaemonSet (`plugin`, the simulated agent
//! of [`agent_template`]) from its own custom resource and reconciles it the
//! way its upstream operator does, as a tokio task driven by two watches (the
//! custom resource and the DaemonSet), so that owner-aware mode is tested
//! against an owner that answers its writes.
//!
//! - [`Vendor::Nvidia`], the NVIDIA GPU Operator's ClusterPolicy
//!   (`controllers/object_controls.go`): **hash and update**. It hashes the
//!   DaemonSet it wants and compares the hash with the live object's
//!   `nvidia.com/last-applied-hash` annotation; only when they differ does it
//!   `Update` the whole object (template, update strategy, labels,
//!   annotations). An outside edit of the DaemonSet therefore survives until
//!   the ClusterPolicy changes, and is then overwritten.
//! - [`Vendor::Amd`], the AMD GPU Operator's DeviceConfig
//!   (`internal/plugin/plugin.go` `SetDevicePluginAsDesired`, applied by
//!   `controllerutil.CreateOrPatch`; `internal/controllers/watchers/daemonset.go`
//!   re-queues the DeviceConfig on any generation change of its DaemonSet):
//!   **revert on generation**. On any change of the DeviceConfig, or of the
//!   DaemonSet's generation, the whole DaemonSet spec is replaced with the
//!   one it wants when they differ.
//! - [`Vendor::Intel`], the Intel device plugins operator's GpuDevicePlugin
//!   (`pkg/controllers/reconciler.go`, `pkg/controllers/gpu/controller.go`
//!   `UpdateDaemonSet`): **revert selected fields**. On any change of the
//!   DaemonSet (or the GpuDevicePlugin) it puts back the image, the args,
//!   the node selector and the tolerations when they differ, and leaves
//!   everything else as it is: an outside `OnDelete` survives.
//!
//! Each stand-in counts the writes it made to the DaemonSet ([`StandIn::writes`],
//! with what each wrote in [`StandIn::write_log`]), so a test can tell a
//! stand-in that had to fight (writing again and again) from one that wrote
//! once per change of its custom resource; and it says which generations of
//! its custom resource and of the DaemonSet it last reconciled against
//! ([`StandIn::wait_synced`]), so a test can wait until it has had its say
//! instead of sleeping.
//!
//! Deviations from upstream, none of which changes what owner-aware mode
//! sees: the DaemonSet is named `plugin` and runs the simulated agent (the
//! tests' helpers look for it), in the test's namespace; the custom
//! resources carry only the fields the stand-ins read; a failed write is
//! retried on the next event instead of after a back-off; and where AMD's
//! `CreateOrPatch` sends a patch whenever its un-defaulted desired spec
//! differs from the defaulted live one (almost always; the API server then
//! makes it a no-op), the stand-in asks the API server the same question with
//! a dry run first and writes only when the outcome differs, so that only
//! writes that change the DaemonSet are counted.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use saferollout_testkit::wait_for_object;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::dra::ClusterObject;
use super::{TIMEOUT, agent_template};

/// The DaemonSet every stand-in builds (the name the tests' helpers and
/// SafeRollouts use).
pub const DAEMONSET: &str = "plugin";

/// The annotation NVIDIA's operator keeps its desired object's hash in.
pub const NVIDIA_HASH: &str = "nvidia.com/last-applied-hash";

/// Which vendor operator a stand-in reproduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    /// NVIDIA GPU Operator: ClusterPolicy `nvidia.com/v1`, cluster-scoped.
    Nvidia,
    /// AMD GPU Operator: DeviceConfig `amd.com/v1alpha1`, namespaced.
    Amd,
    /// Intel device plugins operator: GpuDevicePlugin
    /// `deviceplugin.intel.com/v1`, cluster-scoped.
    Intel,
}

impl Vendor {
    pub fn kind(self) -> &'static str {
        match self {
            Vendor::Nvidia => "ClusterPolicy",
            Vendor::Amd => "DeviceConfig",
            Vendor::Intel => "GpuDevicePlugin",
        }
    }

    fn group(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia.com",
            Vendor::Amd => "amd.com",
            Vendor::Intel => "deviceplugin.intel.com",
        }
    }

    fn version(self) -> &'static str {
        match self {
            Vendor::Nvidia | Vendor::Intel => "v1",
            Vendor::Amd => "v1alpha1",
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Vendor::Nvidia => "clusterpolicies",
            Vendor::Amd => "deviceconfigs",
            Vendor::Intel => "gpudeviceplugins",
        }
    }

    fn namespaced(self) -> bool {
        self == Vendor::Amd
    }

    pub fn api_version(self) -> String {
        format!("{}/{}", self.group(), self.version())
    }

    /// The field manager the vendor's operator writes with.
    pub fn field_manager(self) -> &'static str {
        match self {
            Vendor::Nvidia => "gpu-operator",
            Vendor::Amd => "amd-gpu-operator",
            Vendor::Intel => "intel-device-plugins-operator",
        }
    }

    fn api_resource(self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(self.group(), self.version(), self.kind()),
            self.plural(),
        )
    }

    fn crd_name(self) -> String {
        format!("{}.{}", self.plural(), self.group())
    }

    /// The CRD, as the vendor's chart installs it, its schema aside.
    fn crd(self) -> Value {
        let kind = self.kind();
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": self.crd_name()},
            "spec": {
                "group": self.group(),
                "scope": if self.namespaced() { "Namespaced" } else { "Cluster" },
                "names": {"kind": kind, "listKind": format!("{kind}List"),
                    "plural": self.plural(), "singular": kind.to_lowercase()},
                "versions": [{"name": self.version(), "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object",
                        "x-kubernetes-preserve-unknown-fields": true}}}]
            }
        })
    }

    /// The custom resource's spec for a release of `image`, with the
    /// vendor's own update strategy left at its default (RollingUpdate).
    fn initial_spec(self, image: &str) -> Value {
        match self {
            Vendor::Nvidia => {
                let (repository, name, version) = split_image(image);
                json!({
                    "daemonsets": {"updateStrategy": "RollingUpdate"},
                    "devicePlugin": {"repository": repository, "image": name, "version": version}
                })
            }
            Vendor::Amd => json!({
                "devicePlugin": {"devicePluginImage": image,
                    "upgradePolicy": {"upgradeStrategy": "RollingUpdate", "maxUnavailable": 1}}
            }),
            Vendor::Intel => json!({
                "image": image,
                "args": ["-v", "2", "-shared-dev-num", "1"],
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "tolerations": [{"key": "example.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
            }),
        }
    }

    /// `<plural>.<group>`, as `spec.ownerRevert.resource` names it.
    pub fn resource(self) -> &'static str {
        match self {
            Vendor::Nvidia => "clusterpolicies.nvidia.com",
            Vendor::Amd => "deviceconfigs.amd.com",
            Vendor::Intel => "gpudeviceplugins.deviceplugin.intel.com",
        }
    }

    /// A merge patch of the custom resource making a release of `image`:
    /// its version fields.
    pub fn release_patch(self, image: &str) -> Value {
        match self {
            Vendor::Nvidia => {
                let (repository, name, version) = split_image(image);
                json!({"spec": {"devicePlugin":
                    {"repository": repository, "image": name, "version": version}}})
            }
            Vendor::Amd => json!({"spec": {"devicePlugin": {"devicePluginImage": image}}}),
            Vendor::Intel => json!({"spec": {"image": image}}),
        }
    }

    /// A merge patch of the custom resource making its DaemonSets
    /// `OnDelete`, for the vendors that have such a field (Intel has none).
    pub fn on_delete_patch(self) -> Option<Value> {
        match self {
            Vendor::Nvidia => Some(json!({"spec": {"daemonsets": {"updateStrategy": "OnDelete"}}})),
            Vendor::Amd => Some(json!({"spec": {"devicePlugin":
                {"upgradePolicy": {"upgradeStrategy": "OnDelete"}}}})),
            Vendor::Intel => None,
        }
    }
}

/// `registry.example/plugin:v1` as NVIDIA's three fields: (repository,
/// image, version).
fn split_image(image: &str) -> (&str, &str, &str) {
    let (path, version) = image.rsplit_once(':').unwrap_or((image, "latest"));
    let (repository, name) = path.rsplit_once('/').unwrap_or(("", path));
    (repository, name, version)
}

/// A vendor operator's stand-in, with its custom resource; stops (and
/// deletes a cluster-scoped custom resource) when dropped.
pub struct StandIn {
    pub vendor: Vendor,
    /// The custom resource's name.
    pub name: String,
    crs: Api<DynamicObject>,
    writes: Arc<Mutex<Vec<String>>>,
    /// The generation of the custom resource as the test last wrote it.
    cr_generation: Mutex<i64>,
    /// The generations of the custom resource and the DaemonSet the
    /// stand-in last handled.
    synced: watch::Receiver<Synced>,
    task: JoinHandle<()>,
    _cluster_object: Option<ClusterObject>,
}

impl StandIn {
    /// Installs the vendor's CRD, creates its custom resource for a release
    /// of `image` (the vendor's own OnDelete setting unset), and starts the
    /// reconcile loop, which creates the DaemonSet in `ns`, its agent
    /// advertising `resource`.
    pub async fn start(
        vendor: Vendor,
        client: &Client,
        ns: &str,
        resource: &str,
        image: &str,
    ) -> anyhow::Result<Self> {
        install_crd(client, vendor).await?;
        let ar = vendor.api_resource();
        let crs: Api<DynamicObject> = if vendor.namespaced() {
            Api::namespaced_with(client.clone(), ns, &ar)
        } else {
            Api::all_with(client.clone(), &ar)
        };
        let name = match vendor {
            Vendor::Nvidia => format!("cluster-policy-{ns}"),
            Vendor::Amd => format!("device-config-{ns}"),
            Vendor::Intel => format!("gpu-plugin-{ns}"),
        };
        let mut cr =
            DynamicObject::new(&name, &ar).data(json!({"spec": vendor.initial_spec(image)}));
        if vendor.namespaced() {
            cr = cr.within(ns);
        }
        let created = crs
            .create(&PostParams::default(), &cr)
            .await
            .with_context(|| format!("creating {} {name}", vendor.kind()))?;
        let cluster_object =
            (!vendor.namespaced()).then(|| ClusterObject::new(&vendor.crd_name(), &name));
        let writes = Arc::new(Mutex::new(Vec::new()));
        let (synced_tx, synced) = watch::channel(Synced::default());
        let reconciler = Reconciler {
            vendor,
            ns: ns.to_string(),
            resource: resource.to_string(),
            dss: Api::namespaced(client.clone(), ns),
            cr: None,
            ds: None,
            cr_listed: false,
            ds_listed: false,
            seen_generation: None,
            retry: false,
            writes: writes.clone(),
            synced: synced_tx,
        };
        let task = tokio::spawn(reconciler.run(crs.clone(), name.clone()));
        Ok(StandIn {
            vendor,
            name,
            crs,
            writes,
            cr_generation: Mutex::new(created.metadata.generation.unwrap_or_default()),
            synced,
            task,
            _cluster_object: cluster_object,
        })
    }

    /// The custom resource's UID.
    pub async fn uid(&self) -> anyhow::Result<String> {
        Ok(self.crs.get(&self.name).await?.uid().unwrap_or_default())
    }

    /// Writes the stand-in made to the DaemonSet so far (its creation included).
    pub fn writes(&self) -> usize {
        self.writes.lock().unwrap().len()
    }

    /// What each of those writes was.
    pub fn write_log(&self) -> Vec<String> {
        self.writes.lock().unwrap().clone()
    }

    /// Waits until the stand-in has handled the DaemonSet at `generation` or
    /// later, and the custom resource as the test last wrote it: every write
    /// it decided from what it saw until then is counted.
    pub async fn wait_synced(&self, generation: i64) -> anyhow::Result<()> {
        let want = Synced {
            cr: *self.cr_generation.lock().unwrap(),
            ds: generation,
        };
        let mut rx = self.synced.clone();
        let seen =
            tokio::time::timeout(TIMEOUT, rx.wait_for(|s| s.cr >= want.cr && s.ds >= want.ds))
                .await
                .with_context(|| {
                    format!(
                        "{:?} stand-in never reconciled {want:?} (last: {:?})",
                        self.vendor,
                        *self.synced.borrow()
                    )
                })?;
        seen.map(|_| ()).context("the stand-in's task ended")
    }

    /// Patches the custom resource (a merge patch), as a person does.
    pub async fn patch(&self, patch: &Value) -> anyhow::Result<()> {
        let written = self
            .crs
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .with_context(|| format!("patching {} {}", self.vendor.kind(), self.name))?;
        // No status subresource: any change moves the generation.
        *self.cr_generation.lock().unwrap() = written.metadata.generation.unwrap_or_default();
        Ok(())
    }

    /// A release of `image` made in the custom resource: its version fields.
    pub async fn release(&self, image: &str) -> anyhow::Result<()> {
        self.patch(&self.vendor.release_patch(image)).await
    }

    /// The field managers that wrote the custom resource's `spec`.
    pub async fn cr_managers(&self) -> anyhow::Result<BTreeSet<String>> {
        let cr = self.crs.get(&self.name).await?;
        Ok(cr
            .managed_fields()
            .iter()
            .filter(|m| {
                m.fields_v1
                    .as_ref()
                    .is_some_and(|f| f.0.get("f:spec").is_some())
            })
            .filter_map(|m| m.manager.clone())
            .collect())
    }

    /// The vendor's own OnDelete setting set in the custom resource.
    pub async fn set_on_delete(&self) -> anyhow::Result<()> {
        let Some(patch) = self.vendor.on_delete_patch() else {
            bail!("{} has no update strategy field", self.vendor.kind());
        };
        self.patch(&patch).await
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Installs `vendor`'s CRD (server-side apply, as `kubectl apply
/// --server-side` does) and waits until it is served.
async fn install_crd(client: &Client, vendor: Vendor) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = vendor.crd_name();
    crds.patch(
        &name,
        &PatchParams::apply("saferollout-tests").force(),
        &Patch::Apply(vendor.crd()),
    )
    .await
    .with_context(|| format!("applying CRD {name}"))?;
    wait_for_object(&crds, &name, Duration::from_secs(60), |crd| {
        crd.and_then(|c| c.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            })
    })
    .await?;
    Ok(())
}

/// The generations the reconcile loop last handled (0: none).
#[derive(Debug, Clone, Copy, Default)]
struct Synced {
    cr: i64,
    ds: i64,
}

/// What woke the reconcile loop (boxed: a DaemonSet is large).
enum Wake {
    Cr(Box<watcher::Event<DynamicObject>>),
    Ds(Box<watcher::Event<DaemonSet>>),
}

/// The reconcile loop's state: the watches' latest picture of the custom
/// resource and the DaemonSet (the informer cache of a controller-runtime
/// operator), and what it wrote.
struct Reconciler {
    vendor: Vendor,
    ns: String,
    resource: String,
    dss: Api<DaemonSet>,
    cr: Option<DynamicObject>,
    ds: Option<DaemonSet>,
    cr_listed: bool,
    ds_listed: bool,
    /// The DaemonSet generation last handled (AMD re-queues on a change).
    seen_generation: Option<i64>,
    /// The last reconcile failed (a conflict with a newer object, say):
    /// reconcile again on the next event, whatever it is.
    retry: bool,
    writes: Arc<Mutex<Vec<String>>>,
    synced: watch::Sender<Synced>,
}

impl Reconciler {
    async fn run(mut self, crs: Api<DynamicObject>, name: String) {
        let by_name = |n: &str| watcher::Config::default().fields(&format!("metadata.name={n}"));
        let cr_events = watcher(crs, by_name(&name))
            .default_backoff()
            .map(|e| e.map(|e| Wake::Cr(Box::new(e))))
            .boxed();
        let ds_events = watcher(self.dss.clone(), by_name(DAEMONSET))
            .default_backoff()
            .map(|e| e.map(|e| Wake::Ds(Box::new(e))))
            .boxed();
        let mut events = stream::select(cr_events, ds_events);
        while let Some(event) = events.next().await {
            let event = match event {
                Ok(e) => e,
                Err(e) => {
                    eprintln!("{:?} stand-in: watch error (it resumes): {e}", self.vendor);
                    continue;
                }
            };
            let woken = self.observe(event);
            if !(self.cr_listed && self.ds_listed) {
                continue;
            }
            let generation = self.ds.as_ref().and_then(|d| d.metadata.generation);
            let generation_moved = generation != self.seen_generation;
            self.seen_generation = generation;
            let reconcile = self.retry
                || match woken {
                    Woken::Cr | Woken::Listed => true,
                    // NVIDIA and Intel own the DaemonSet (controller-runtime
                    // `Owns`): every change of it reconciles. AMD's handler
                    // re-queues only on a generation change.
                    Woken::Ds => self.vendor != Vendor::Amd || generation_moved,
                    Woken::Nothing => false,
                };
            if reconcile {
                self.retry = false;
                if let Err(e) = self.reconcile().await {
                    eprintln!(
                        "{:?} stand-in: reconcile failed (again on the next event): {e:#}",
                        self.vendor
                    );
                    self.retry = true;
                }
            }
            if self.retry {
                // Not had its say yet: the next event reconciles again.
                continue;
            }
            self.synced.send_replace(Synced {
                cr: self
                    .cr
                    .as_ref()
                    .and_then(|c| c.metadata.generation)
                    .unwrap_or_default(),
                ds: generation.unwrap_or_default(),
            });
        }
    }

    /// Takes in a watch event; says what it woke.
    fn observe(&mut self, event: Wake) -> Woken {
        match event {
            Wake::Cr(e) => match *e {
                watcher::Event::Init => {
                    self.cr = None;
                    self.cr_listed = false;
                    Woken::Nothing
                }
                watcher::Event::InitApply(o) => {
                    self.cr = Some(o);
                    Woken::Nothing
                }
                watcher::Event::InitDone => {
                    self.cr_listed = true;
                    Woken::Listed
                }
                watcher::Event::Apply(o) => {
                    self.cr = Some(o);
                    Woken::Cr
                }
                watcher::Event::Delete(_) => {
                    self.cr = None;
                    Woken::Cr
                }
            },
            Wake::Ds(e) => match *e {
                watcher::Event::Init => {
                    self.ds = None;
                    self.ds_listed = false;
                    Woken::Nothing
                }
                watcher::Event::InitApply(o) => {
                    self.ds = Some(o);
                    Woken::Nothing
                }
                watcher::Event::InitDone => {
                    self.ds_listed = true;
                    Woken::Listed
                }
                watcher::Event::Apply(o) => {
                    self.ds = Some(o);
                    Woken::Ds
                }
                watcher::Event::Delete(_) => {
                    self.ds = None;
                    Woken::Ds
                }
            },
        }
    }

    async fn reconcile(&self) -> anyhow::Result<()> {
        // Its custom resource gone, the garbage collector deletes the DaemonSet.
        let Some(cr) = &self.cr else { return Ok(()) };
        let spec = cr.data.get("spec").cloned().unwrap_or_default();
        match self.vendor {
            Vendor::Nvidia => self.reconcile_nvidia(cr, &spec).await,
            Vendor::Amd => self.reconcile_amd(cr, &spec).await,
            Vendor::Intel => self.reconcile_intel(cr, &spec).await,
        }
    }

    /// NVIDIA (`object_controls.go`, `createOrUpdateDaemonSet` and
    /// `isDaemonsetSpecChanged`): the desired object's hash against the
    /// live object's `nvidia.com/last-applied-hash`; the whole object
    /// updated only when they differ.
    async fn reconcile_nvidia(&self, cr: &DynamicObject, spec: &Value) -> anyhow::Result<()> {
        let plugin = &spec["devicePlugin"];
        let field = |f: &str| plugin[f].as_str().unwrap_or_default().to_string();
        let image = format!(
            "{}/{}:{}",
            field("repository"),
            field("image"),
            field("version")
        );
        let strategy = match spec["daemonsets"]["updateStrategy"].as_str() {
            Some("OnDelete") => json!({"type": "OnDelete"}),
            // `spec.daemonsets.rollingUpdate.maxUnavailable`, default "1",
            // parsed with `intstr.Parse`: an integer.
            _ => json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}),
        };
        let mut want = json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": DAEMONSET, "namespace": self.ns,
                "labels": {"app": DAEMONSET, "app.kubernetes.io/managed-by": "gpu-operator"},
                "annotations": {},
                "ownerReferences": [self.owner_reference(cr)]},
            "spec": {"selector": {"matchLabels": {"app": DAEMONSET}},
                "template": agent_template(&self.resource, &image),
                "updateStrategy": strategy}
        });
        let hash = hex(&Sha256::digest(serde_json::to_vec(&want)?)[..8]);
        want["metadata"]["annotations"][NVIDIA_HASH] = json!(hash);
        let mut want: DaemonSet = serde_json::from_value(want)?;
        match &self.ds {
            None => self.create(&want).await,
            Some(found) if found.annotations().get(NVIDIA_HASH) == Some(&hash) => Ok(()),
            Some(found) => {
                want.metadata.resource_version = found.metadata.resource_version.clone();
                self.replace(&want).await
            }
        }
    }

    /// AMD (`SetDevicePluginAsDesired` in `CreateOrPatch`): the whole spec
    /// replaced with the desired one when, defaulted, it differs.
    async fn reconcile_amd(&self, cr: &DynamicObject, spec: &Value) -> anyhow::Result<()> {
        let plugin = &spec["devicePlugin"];
        let image = plugin["devicePluginImage"].as_str().unwrap_or_default();
        let policy = &plugin["upgradePolicy"];
        let strategy = match policy["upgradeStrategy"].as_str() {
            Some("OnDelete") => json!({"type": "OnDelete"}),
            _ => json!({"type": "RollingUpdate", "rollingUpdate":
                {"maxUnavailable": policy["maxUnavailable"].as_i64().unwrap_or(1)}}),
        };
        let want: DaemonSetSpec = serde_json::from_value(json!({
            "selector": {"matchLabels": {"app": DAEMONSET}},
            "template": agent_template(&self.resource, image),
            "updateStrategy": strategy
        }))?;
        let Some(found) = &self.ds else {
            let ds: DaemonSet = serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": {"name": DAEMONSET, "namespace": self.ns,
                    "ownerReferences": [self.owner_reference(cr)]},
                "spec": want
            }))?;
            return self.create(&ds).await;
        };
        let mut ds = found.clone();
        ds.metadata.managed_fields = None;
        ds.status = None;
        ds.spec = want;
        // The dry run without the resource version: a status write since the
        // watch's picture would only make it conflict. The write itself is
        // made under it.
        let mut probe = ds.clone();
        probe.metadata.resource_version = None;
        let outcome = self
            .dss
            .replace(
                DAEMONSET,
                &PostParams {
                    dry_run: true,
                    field_manager: Some(self.vendor.field_manager().into()),
                },
                &probe,
            )
            .await?;
        if outcome.spec == found.spec {
            return Ok(());
        }
        self.replace(&ds).await
    }

    /// Intel (`UpdateDaemonSet`, then `Update`): image, args, node selector
    /// and tolerations put back when they differ; nothing else touched.
    async fn reconcile_intel(&self, cr: &DynamicObject, spec: &Value) -> anyhow::Result<()> {
        let image = spec["image"].as_str().unwrap_or_default().to_string();
        let args: Vec<String> = serde_json::from_value(spec["args"].clone()).unwrap_or_default();
        let node_selector: Option<std::collections::BTreeMap<String, String>> =
            serde_json::from_value(spec["nodeSelector"].clone()).ok();
        let tolerations: Option<Vec<Toleration>> =
            serde_json::from_value(spec["tolerations"].clone()).ok();
        let Some(found) = &self.ds else {
            // `NewDaemonSet`: the plugin's deployment manifest (RollingUpdate,
            // maxUnavailable 1) with the GpuDevicePlugin's fields.
            let mut ds: DaemonSet = serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": {"name": DAEMONSET, "namespace": self.ns,
                    "ownerReferences": [self.owner_reference(cr)]},
                "spec": {"selector": {"matchLabels": {"app": DAEMONSET}},
                    "template": agent_template(&self.resource, &image),
                    "updateStrategy": {"type": "RollingUpdate",
                        "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}}
            }))?;
            let pod = ds.spec.template.spec.as_mut().context("template")?;
            pod.containers[0].args = Some(args);
            pod.node_selector = node_selector;
            pod.tolerations = tolerations;
            return self.create(&ds).await;
        };
        let mut ds = found.clone();
        let pod = ds
            .spec
            .template
            .spec
            .as_mut()
            .context("the DaemonSet has no pod spec")?;
        let mut updated = false;
        let container = pod.containers.first_mut().context("no container")?;
        if container.image.as_deref() != Some(image.as_str()) {
            container.image = Some(image);
            updated = true;
        }
        if container.args.clone().unwrap_or_default().join(" ") != args.join(" ") {
            container.args = Some(args);
            updated = true;
        }
        let empty = |m: &Option<std::collections::BTreeMap<String, String>>| {
            m.as_ref().is_none_or(|m| m.is_empty())
        };
        if pod.node_selector != node_selector
            && !(empty(&pod.node_selector) && empty(&node_selector))
        {
            pod.node_selector = node_selector;
            updated = true;
        }
        let none = |t: &Option<Vec<Toleration>>| t.as_ref().is_none_or(|t| t.is_empty());
        if pod.tolerations != tolerations && !(none(&pod.tolerations) && none(&tolerations)) {
            pod.tolerations = tolerations;
            updated = true;
        }
        if !updated {
            return Ok(());
        }
        ds.metadata.managed_fields = None;
        self.replace(&ds).await
    }

    /// The controller owner reference `SetControllerReference` writes.
    fn owner_reference(&self, cr: &DynamicObject) -> Value {
        json!({"apiVersion": self.vendor.api_version(), "kind": self.vendor.kind(),
            "name": cr.name_any(), "uid": cr.uid().unwrap_or_default(),
            "controller": true, "blockOwnerDeletion": true})
    }

    fn params(&self) -> PostParams {
        PostParams {
            dry_run: false,
            field_manager: Some(self.vendor.field_manager().into()),
        }
    }

    async fn create(&self, ds: &DaemonSet) -> anyhow::Result<()> {
        let written = self.dss.create(&self.params(), ds).await?;
        self.record("created", &written);
        Ok(())
    }

    /// An `Update` (PUT) under the live object's resource version: a
    /// conflict with a newer object fails it, and the next event retries.
    async fn replace(&self, ds: &DaemonSet) -> anyhow::Result<()> {
        let written = self.dss.replace(DAEMONSET, &self.params(), ds).await?;
        self.record("updated", &written);
        Ok(())
    }

    fn record(&self, what: &str, ds: &DaemonSet) {
        let spec = &ds.spec;
        let image = spec
            .template
            .spec
            .as_ref()
            .and_then(|p| p.containers.first())
            .and_then(|c| c.image.clone())
            .unwrap_or_default();
        let strategy = spec
            .update_strategy
            .as_ref()
            .and_then(|u| u.type_.clone())
            .unwrap_or_default();
        let line = format!(
            "{what} DaemonSet {} (generation {}): image {image}, updateStrategy {strategy}",
            ds.name_any(),
            ds.metadata.generation.unwrap_or_default()
        );
        eprintln!("{:?} stand-in: {line}", self.vendor);
        self.writes.lock().unwrap().push(line);
    }
}

/// What an event woke.
enum Woken {
    /// A list (the first, or after the watch broke) completed.
    Listed,
    /// The custom resource changed.
    Cr,
    /// The DaemonSet changed.
    Ds,
    /// Nothing to reconcile yet (a list under way).
    Nothing,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
