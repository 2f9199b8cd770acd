# opendws on Google Cloud: the root wires the modules together. Each function has its own
# service account holding only what its code calls (see `local.project_roles` and the grants
# on single resources below); nothing holds a basic role.

data "google_project" "this" {
  project_id = var.project
}

locals {
  archive              = coalesce(var.source_archive, "${path.module}/build/opendws-functions.zip")
  pubsub_service_agent = "service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"

  # The functions of functions/main.py: entry point => deployed name.
  names = {
    intake    = "opendws-intake"
    reconcile = "opendws-reconcile"
    timer     = "opendws-timer"
    ci_hook   = "opendws-ci-hook"
    api       = "opendws-api"
    agent     = "opendws-agent"
  }
  # Cloud Tasks calls the timer, whose ingress is internal-only, and such a service admits
  # Cloud Tasks of its project only at its default run.app URL, not at cloudfunctions.net
  # (run/docs/securing/ingress). Its deterministic form, https://SERVICE-PROJECT_NUMBER.REGION
  # .run.app (run/docs/triggering/https-request), is known before the function exists: the
  # functions that arm timers (the timer among them: it re-arms the hops of far timers) need it
  # in their environment, so it cannot come from the function's own `service_config[0].uri`.
  # It is the tasks' URL and their OIDC audience alike (tasks v2 OidcToken.audience).
  timer_url = "https://${local.names.timer}-${data.google_project.this.number}.${var.region}.run.app"

  # The agent function's URL: where the job VMs' agents report (the instance attribute
  # opendws-agent-url) and the audience of their identity tokens, which the function checks
  # against its own OPENDWS_AGENT_URL: one value for both. Its deterministic run.app URL (as
  # timer_url above) is known before the function exists, so the function's own environment,
  # the reconciler's (templates, sweep) and the VMs' templates need not depend on it.
  agent_url = "https://${local.names.agent}-${data.google_project.this.number}.${var.region}.run.app"

  # The api's URLs, the audiences a workload's Google ID token may name (the function's
  # cloudfunctions.net URL, its `url` output, and its service's deterministic run.app URL;
  # neither can come from the function itself, whose environment this is).
  api_urls = [
    "https://${var.region}-${var.project}.cloudfunctions.net/${local.names.api}",
    "https://${local.names.api}-${data.google_project.this.number}.${var.region}.run.app",
  ]
  # With IAP in front and its direct URL closed, only the load balancer reaches the api, and
  # IAP's service agent invokes it (iap/docs/enabling-cloud-run).
  api_direct          = var.api_iap == null ? true : var.api_iap.direct_url
  iap_service_agent   = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-iap.iam.gserviceaccount.com"
  api_iap_environment = var.api_iap == null ? {} : { OPENDWS_API_IAP_AUDIENCE = module.api_iap[0].audience }

  # Ending a run (release, cancel, a timer, the reconciler's sweep) deletes resize requests,
  # VMs, queued resources and future reservations; starting one creates them.
  capacity_roles = [
    "roles/compute.instanceAdmin.v1",
    "roles/compute.futureReservationAdmin",
    "roles/tpu.admin",
  ]
  # Every function exports its metrics to Cloud Monitoring (OPENDWS_METRICS_EXPORT below).
  metric_roles = ["roles/monitoring.metricWriter"]
  project_roles = {
    intake    = concat(["roles/datastore.user"], local.capacity_roles, local.metric_roles) # cancel and release messages end runs
    reconcile = concat(["roles/datastore.user"], local.capacity_roles, local.metric_roles)
    timer     = concat(["roles/datastore.user"], local.capacity_roles, local.metric_roles)
    api       = concat(["roles/datastore.user"], local.capacity_roles, local.metric_roles) # cancel and release
    ci_hook   = concat(["roles/datastore.viewer"], local.metric_roles)                     # reads the CI mappings in config/scheduler
    agent     = concat(["roles/datastore.user"], local.capacity_roles, local.metric_roles) # an order's VMs (instances.list); a run's end releases
  }

  # The account Cloud Build builds the functions as: the one named, or opendws-build with the
  # roles Google documents for a function's build account (run/docs/configuring/services/
  # build-service-account; magic-modules cloudfunctions2_basic_builder.tf.tmpl): build logs,
  # the built image, the source. A new project's default build account may lack them
  # (functions/docs/securing/build-custom-sa).
  build_roles = ["roles/logging.logWriter", "roles/artifactregistry.writer", "roles/storage.objectAdmin"]
  build_accounts = var.build_service_account != null ? {} : {
    build = {
      account_id    = "opendws-build"
      display_name  = "opendws function builds"
      description   = "Cloud Build builds the opendws functions as this account."
      project_roles = local.build_roles
    }
  }
  build_service_account = var.build_service_account == null ? module.identities.names["build"] : var.build_service_account

  # The job VMs' own account: the agent writes the job's output to Cloud Logging, and Docker
  # pulls the job's image from Artifact Registry (artifact-registry/docs/access-control). The
  # job's secrets come from the agent function, so the VMs read none.
  vm_roles = ["roles/logging.logWriter", "roles/artifactregistry.reader"]
  # Its email, known before it exists (a service account's email is ACCOUNT_ID@PROJECT.iam.
  # gserviceaccount.com), so that templates can name it at plan time.
  vm_account_email = "opendws-vm@${var.project}.iam.gserviceaccount.com"

  member = module.identities.members

  common_environment = {
    OPENDWS_PROJECT               = var.project
    OPENDWS_TASKS_LOCATION        = var.region
    OPENDWS_TASKS_QUEUE           = module.tasks.queue
    OPENDWS_TIMER_URL             = local.timer_url
    OPENDWS_TIMER_AUDIENCE        = local.timer_url
    OPENDWS_TIMER_SERVICE_ACCOUNT = module.identities.emails.tasks
    OPENDWS_BOOT_IMAGE            = var.vm_boot_image
    OPENDWS_NETWORK               = var.vm_network
    OPENDWS_TPU_RUNTIME_VERSION   = var.tpu_runtime_version
    OPENDWS_TPU_TIER              = var.tpu_tier
    # What every job VM carries: the agent, reporting to the agent function, and its own
    # service account (logs and image pulls only).
    OPENDWS_AGENT_URL          = local.agent_url
    OPENDWS_VM_SERVICE_ACCOUNT = module.identities.emails.vm
    # Each function's metrics: snapshots in Firestore (the api's /metrics) and Cloud Monitoring.
    OPENDWS_METRICS_EXPORT = "snapshots,cloud_monitoring"
    LOG_EXECUTION_ID       = "true"
  }
}

module "apis" {
  source = "./modules/apis"
  count  = var.enable_apis ? 1 : 0

  project = var.project
}

module "identities" {
  source = "./modules/identities"

  project = var.project
  accounts = merge(
    {
      for key, name in local.names : key => {
        account_id    = name
        display_name  = "opendws ${key} function"
        description   = "The identity of the ${name} function."
        project_roles = local.project_roles[key]
      }
    },
    {
      tasks = {
        account_id    = "opendws-tasks"
        display_name  = "opendws timers"
        description   = "Cloud Tasks calls the timer function with this account's OIDC token."
        project_roles = []
      }
      trigger = {
        account_id    = "opendws-trigger"
        display_name  = "opendws Pub/Sub triggers"
        description   = "Eventarc invokes intake and reconcile as this account."
        project_roles = []
      }
      vm = {
        account_id    = "opendws-vm"
        display_name  = "opendws job VMs"
        description   = "The job VMs run as this account: it writes their logs and pulls their images, and reads no secret."
        project_roles = local.vm_roles
      }
    },
    local.build_accounts,
  )
  firestore_database = module.firestore.database

  depends_on = [module.apis]
}

module "pubsub" {
  source = "./modules/pubsub"

  project              = var.project
  labels               = var.labels
  pubsub_service_agent = local.pubsub_service_agent
  tenants              = var.tenants
  admins               = var.admins
  # The CI hook publishes each request for the tenant of the CI mapping it matched.
  every_tenant_publishers = [local.member.ci_hook]
  shared_requests_topic   = var.shared_requests_topic
  request_publishers      = var.request_publishers
  event_publishers        = [local.member.intake, local.member.reconcile, local.member.timer, local.member.api, local.member.agent]
  tick_publishers         = [local.member.intake, local.member.timer, local.member.api, local.member.agent]
  event_subscribers       = var.event_subscribers
  dead_letter_readers     = var.operators

  depends_on = [module.apis]
}

module "firestore" {
  source = "./modules/firestore"

  project             = var.project
  location            = var.firestore_location
  deletion_protection = var.deletion_protection

  depends_on = [module.apis]
}

module "secrets" {
  source = "./modules/secrets"

  project         = var.project
  labels          = var.labels
  api_tenants     = var.api_tenants
  hook_readers    = [local.member.ci_hook]
  api_key_readers = [local.member.api]
  # The agent function signs sessions with it; the reconciler's sweep builds the same service.
  agent_session_key_readers = [local.member.agent, local.member.reconcile]

  depends_on = [module.apis]
}

module "tasks" {
  source = "./modules/tasks"

  project                   = var.project
  region                    = var.region
  name                      = var.timer_queue.name
  max_dispatches_per_second = var.timer_queue.max_dispatches_per_second
  max_concurrent_dispatches = var.timer_queue.max_concurrent_dispatches
  timer_setters             = [local.member.intake, local.member.reconcile, local.member.timer, local.member.api]
  timer_deleters            = [local.member.agent] # a run's end disarms its timers
  invoker_account_name      = module.identities.names.tasks

  depends_on = [module.apis]
}

module "source" {
  source = "./modules/source"

  project     = var.project
  bucket_name = "${var.project}-opendws-source"
  location    = var.region
  archive     = local.archive
  labels      = var.labels

  depends_on = [module.apis]
}

module "compute_pools" {
  source = "./modules/compute_pools"

  project                 = var.project
  boot_image              = var.vm_boot_image
  flex_pools              = var.flex_pools
  default_service_account = local.vm_account_email
  labels                  = var.labels

  # A template names the job VMs' account, which must exist first.
  depends_on = [module.apis, module.identities]
}

# SSH to the gang's VMs (`dws ssh`) goes through IAP TCP forwarding, since they have no
# external address: IAP connects from 35.235.240.0/20, which the network must let in on port 22
# ("Create a firewall rule", cloud.google.com/iap/docs/using-tcp-forwarding). One rule per
# network the VMs use (the reconciler's `vm_network` and each flex pool's); a pool given only a
# subnetwork needs the same rule on that subnetwork's network. Who may open a tunnel is IAM's
# (roles/iap.tunnelResourceAccessor, and OS Login on the VM): see README.md.
locals {
  # The reconciler's network as a resource reference: a name or global/networks/NAME is this
  # project's network, named by name; a full path is passed as it is.
  vm_network_reference = startswith(var.vm_network, "projects/") || startswith(var.vm_network, "https://") ? var.vm_network : reverse(split("/", var.vm_network))[0]
  vm_networks = distinct(concat(
    [var.vm_network],
    [for pool in var.flex_pools : pool.network if pool.subnetwork == null],
  ))
}

resource "google_compute_firewall" "iap_ssh" {
  for_each = var.iap_ssh ? toset(local.vm_networks) : toset([])

  project = var.project
  # A network given by name or as global/networks/NAME is this project's: the rule names it
  # by name; a full path (projects/P/global/networks/N, a shared VPC) is passed as it is.
  network     = startswith(each.value, "projects/") || startswith(each.value, "https://") ? each.value : reverse(split("/", each.value))[0]
  name        = substr("opendws-iap-ssh-${reverse(split("/", each.value))[0]}", 0, 63)
  description = "IAP TCP forwarding to opendws VMs on port 22 (dws ssh)"
  direction   = "INGRESS"
  priority    = 1000

  source_ranges = ["35.235.240.0/20"]
  allow {
    protocol = "tcp"
    ports    = ["22"]
  }

  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }

  depends_on = [module.apis]
}

# VMs that run as a service account are created by functions that must act as it.
resource "google_service_account_iam_member" "act_as_vm_account" {
  for_each = {
    for pair in setproduct(
      distinct(compact([for pool in var.flex_pools : pool.service_account])),
      ["intake", "reconcile", "timer", "api", "agent"],
    ) : "${pair[0]}/${pair[1]}" => pair
  }

  service_account_id = "projects/${var.project}/serviceAccounts/${each.value[0]}"
  role               = "roles/iam.serviceAccountUser"
  member             = local.member[each.value[1]]
}

# The functions that make VMs (templates, resize requests, calendar VMs) run them as the job
# VMs' account, which takes acting as it (compute/docs/access/service-accounts); those that
# release them (the agent function when a run ends, as the api) hold the same.
resource "google_service_account_iam_member" "act_as_job_vm_account" {
  for_each = toset(["intake", "reconcile", "timer", "api", "agent"])

  service_account_id = module.identities.names.vm
  role               = "roles/iam.serviceAccountUser"
  member             = local.member[each.value]
}

# Job VMs have no external address: Private Google Access on their subnets reaches Google's
# APIs (and the agent function's run.app URL); Cloud NAT, where asked for, reaches the rest
# of the internet (image registries other than Artifact Registry, package indexes).
resource "google_compute_router" "vm_nat" {
  for_each = toset(var.vm_nat_regions)

  project = var.project
  name    = "opendws-nat-${each.value}"
  region  = each.value
  network = local.vm_network_reference

  depends_on = [module.apis]
}

resource "google_compute_router_nat" "vm_nat" {
  for_each = toset(var.vm_nat_regions)

  project                            = var.project
  name                               = "opendws-nat-${each.value}"
  router                             = google_compute_router.vm_nat[each.value].name
  region                             = each.value
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "ALL_SUBNETWORKS_ALL_IP_RANGES"

  log_config {
    enable = true
    filter = "ERRORS_ONLY"
  }
}

# Functions ----------------------------------------------------------------------------------

module "intake" {
  source = "./modules/function"

  project               = var.project
  region                = var.region
  name                  = local.names.intake
  entry_point           = "intake"
  description           = "Request topics -> Firestore: accepts, refuses, cancels and releases requests, for the tenant the topic speaks for."
  runtime               = var.runtime
  build_service_account = local.build_service_account
  source_bucket         = module.source.bucket
  source_object         = module.source.object
  service_account_email = module.identities.emails.intake
  environment           = local.common_environment
  timeout_seconds       = 60
  concurrency           = 1
  min_instances         = var.min_instances.intake
  max_instances         = var.max_instances.intake
  labels                = var.labels
  invokers              = [local.member.trigger]

  # Intake raises only on transient faults (bad input is answered with a REJECTED event), so a
  # retried message is worth retrying; one that keeps failing goes to the dead-letter topic.
  # It reads every request topic, and takes who is asking from the one a message came on (the
  # CloudEvent's source): the function's own trigger is on the admins' topic, which always
  # exists; each tenant's topic, and the shared one when made, has an Eventarc trigger of its own.
  pubsub_trigger = {
    topic                 = module.pubsub.request_topic_ids["admin"]
    service_account_email = module.identities.emails.trigger
    retry                 = true
  }
  more_pubsub_topics = { for key, topic in module.pubsub.request_topic_ids : key => topic if key != "admin" }
  dead_letter = var.dead_letter_max_delivery_attempts == null ? null : {
    topic                 = module.pubsub.requests_dead_letter_topic
    max_delivery_attempts = var.dead_letter_max_delivery_attempts
    pubsub_service_agent  = local.pubsub_service_agent
  }

  # Built only once its build account holds its roles.
  depends_on = [module.identities]
}

module "reconcile" {
  source = "./modules/function"

  project               = var.project
  region                = var.region
  name                  = local.names.reconcile
  entry_point           = "reconcile"
  description           = "reconcile-ticks -> one reconcile pass (and follow-ups while capacity is provisioning)."
  runtime               = var.runtime
  build_service_account = local.build_service_account
  source_bucket         = module.source.bucket
  source_object         = module.source.object
  service_account_email = module.identities.emails.reconcile
  environment = merge(local.common_environment, {
    OPENDWS_RECONCILE_FOLLOW_UP_SECONDS = tostring(var.reconcile_follow_up_seconds)
  })
  # After each pass it releases runs whose agents are lost, with the agent function's service.
  secrets = {
    OPENDWS_AGENT_SESSION_KEY = module.secrets.agent_session_key_secret_id
  }
  memory          = "1Gi"
  timeout_seconds = var.reconcile_timeout_seconds
  concurrency     = 1
  min_instances   = var.min_instances.reconcile
  max_instances   = var.max_instances.reconcile
  labels          = var.labels
  invokers        = [local.member.trigger]

  # A tick is not worth retrying: the next tick or nudge starts a fresh pass.
  pubsub_trigger = {
    topic                 = module.pubsub.topic_ids.ticks
    service_account_email = module.identities.emails.trigger
    retry                 = false
  }

  # Built only once its build account holds its roles.
  depends_on = [module.secrets, module.identities]
}

module "timer" {
  source = "./modules/function"

  project               = var.project
  region                = var.region
  name                  = local.names.timer
  entry_point           = "timer"
  description           = "Cloud Tasks timers: release, start and expiry (OIDC from the opendws-tasks account only)."
  runtime               = var.runtime
  build_service_account = local.build_service_account
  source_bucket         = module.source.bucket
  source_object         = module.source.object
  service_account_email = module.identities.emails.timer
  # Cloud Run checks each call's ID token (only the tasks account holds run.invoker; ingress
  # stays internal-only, the default, which admits Cloud Tasks of this project,
  # run/docs/securing/ingress) and hands it on with its signature removed: the timer reads the
  # checked claims instead of verifying the signature again (README: Who may call each function).
  environment = merge(local.common_environment, {
    OPENDWS_INVOKER_CHECKED_BY_RUN = "true"
  })
  timeout_seconds = 60
  concurrency     = 1
  min_instances   = var.min_instances.timer
  max_instances   = var.max_instances.timer
  labels          = var.labels
  invokers        = [local.member.tasks]

  # Built only once its build account holds its roles.
  depends_on = [module.identities]
}

module "ci_hook" {
  source = "./modules/function"

  project               = var.project
  region                = var.region
  name                  = local.names.ci_hook
  entry_point           = "ci_hook"
  description           = "CI webhooks (GitHub, GitLab, generic) -> request messages; callers prove themselves with the shared secrets."
  runtime               = var.runtime
  build_service_account = local.build_service_account
  source_bucket         = module.source.bucket
  source_object         = module.source.object
  service_account_email = module.identities.emails.ci_hook
  environment           = local.common_environment
  secrets = {
    OPENDWS_GITHUB_WEBHOOK_SECRET = module.secrets.hook_secret_ids.github
    OPENDWS_GITLAB_WEBHOOK_TOKEN  = module.secrets.hook_secret_ids.gitlab
    OPENDWS_HOOK_SECRET           = module.secrets.hook_secret_ids.generic
  }
  timeout_seconds = 30
  concurrency     = 8
  min_instances   = var.min_instances.ci_hook
  max_instances   = var.max_instances.ci_hook
  labels          = var.labels
  # GitHub and GitLab call from the internet; the function checks each call's signature.
  ingress  = "ALLOW_ALL"
  invokers = ["allUsers"]

  depends_on = [module.secrets, module.identities]
}

module "api" {
  source = "./modules/function"

  project               = var.project
  region                = var.region
  name                  = local.names.api
  entry_point           = "api"
  description           = "The HTTP API and dashboard; callers present an API key, a Google ID token or IAP's signed header."
  runtime               = var.runtime
  build_service_account = local.build_service_account
  source_bucket         = module.source.bucket
  source_object         = module.source.object
  service_account_email = module.identities.emails.api
  environment = merge(local.common_environment, local.api_iap_environment, {
    OPENDWS_API_AUDIENCES = join(",", local.api_urls)
  })
  secrets = {
    OPENDWS_API_KEYS = module.secrets.api_keys_secret_id
  }
  timeout_seconds = 30
  concurrency     = 8
  min_instances   = var.min_instances.api
  max_instances   = var.max_instances.api
  labels          = var.labels
  # Users' browsers and scripts call it; the function checks each call's API key, ID token or
  # IAP signed header. With api_iap.direct_url off, only IAP's load balancer reaches it.
  ingress  = local.api_direct ? "ALLOW_ALL" : "ALLOW_INTERNAL_AND_GCLB"
  invokers = local.api_direct ? ["allUsers"] : [local.iap_service_agent]

  depends_on = [module.secrets, module.identities]
}

module "agent" {
  source = "./modules/function"

  project               = var.project
  region                = var.region
  name                  = local.names.agent
  entry_point           = "agent"
  description           = "The agents on the gangs' VMs: register with a VM identity token, barrier, heartbeats, output, exits; a run's end releases its capacity."
  runtime               = var.runtime
  build_service_account = local.build_service_account
  source_bucket         = module.source.bucket
  source_object         = module.source.object
  service_account_email = module.identities.emails.agent
  # OPENDWS_AGENT_URL (in the common environment) is its own run.app URL: the audience its
  # callers' identity tokens must name.
  environment = local.common_environment
  secrets = {
    OPENDWS_AGENT_SESSION_KEY = module.secrets.agent_session_key_secret_id
  }
  timeout_seconds = 30
  concurrency     = 8
  min_instances   = var.min_instances.agent
  max_instances   = var.max_instances.agent
  labels          = var.labels
  # The agents call from the job VMs, whose identity tokens name the function's URL as their
  # audience, not Cloud Run's invoker check: the function verifies each token (Google's
  # signature, issuer, audience, expiry, the VM's project, zone, name and instance id) and each
  # session it hands out.
  ingress  = "ALLOW_ALL"
  invokers = ["allUsers"]

  depends_on = [module.secrets, module.identities]
}

# The agent function reads the secrets a run names, which lie within its tenant's secret_prefix
# (the scheduler's configuration): secretAccessor on the prefix's project, held by an IAM
# condition to the secrets whose resource name starts with it. Secret Manager's resource names
# in conditions carry the project number (iam/docs/conditions-resource-attributes,
# secret-manager/docs/access-control), so a prefix naming the project by id is turned into one
# by number. The job VMs' account reads no secret.
locals {
  tenant_secrets = {
    for tenant, prefix in var.tenant_secret_prefixes : tenant => {
      project   = split("/", prefix)[1]
      id_prefix = split("/", prefix)[3]
      by_number = can(regex("^[0-9]+$", split("/", prefix)[1]))
    }
  }
}

data "google_project" "tenant_secrets" {
  for_each = toset([for secrets in values(local.tenant_secrets) : secrets.project if !secrets.by_number])

  project_id = each.value
}

resource "google_project_iam_member" "agent_reads_tenant_secrets" {
  for_each = local.tenant_secrets

  project = each.value.project
  role    = "roles/secretmanager.secretAccessor"
  member  = local.member.agent

  condition {
    title       = "opendws-secrets-of-${each.key}"
    description = "Only the secrets of tenant ${each.key}'s secret_prefix."
    expression  = "resource.name.startsWith(\"projects/${each.value.by_number ? each.value.project : data.google_project.tenant_secrets[each.value.project].number}/secrets/${each.value.id_prefix}\")"
  }

  depends_on = [module.identities]
}

# The agent function mints the CI runners and the reconcile function's sweep deletes the idle
# ones: both read the secrets the CI mappings name (a GitHub App's private key, a GitLab token
# with create_runner and manage_runner), granted on each of those secrets alone (ci_secrets).
# secret_id takes the secret's id and project its project, as magic-modules documents the
# Secret Manager secret IAM resources (resource_iam.html.markdown.tmpl with Secret.yaml's
# iam_policy: parent secret_id, projects/{{project}}/secrets/{{secret_id}}). The ci_hook
# function reads none of them.
locals {
  ci_secret_readers = { agent = local.member.agent, reconcile = local.member.reconcile }
  ci_secret_grants = {
    for pair in setproduct(var.ci_secrets, keys(local.ci_secret_readers)) :
    "${pair[1]} ${pair[0]}" => { secret = pair[0], member = local.ci_secret_readers[pair[1]] }
  }
}

resource "google_secret_manager_secret_iam_member" "reads_ci_secrets" {
  for_each = local.ci_secret_grants

  project   = split("/", each.value.secret)[1]
  secret_id = split("/", each.value.secret)[3]
  role      = "roles/secretmanager.secretAccessor"
  member    = each.value.member

  depends_on = [module.identities]
}

module "monitoring" {
  source                    = "./modules/monitoring"
  project                   = var.project
  wait_threshold_seconds    = var.alert_wait_threshold_seconds
  reconcile_silence_seconds = var.alert_reconcile_silence_seconds
  notification_channels     = var.alert_notification_channels
  depends_on                = [module.apis]
}

module "api_iap" {
  source = "./modules/api_iap"
  count  = var.api_iap == null ? 0 : 1

  project        = var.project
  project_number = data.google_project.this.number
  region         = var.region
  name           = local.names.api
  service_name   = local.names.api
  domain         = var.api_iap.domain
  members        = var.api_iap.members
  labels         = var.labels

  depends_on = [module.apis]
}

module "scheduler" {
  source = "./modules/scheduler"

  project   = var.project
  region    = var.region
  schedule  = var.schedule
  time_zone = var.schedule_time_zone
  topic_id  = module.pubsub.topic_ids.ticks

  depends_on = [module.apis]
}

# The timer URL above assumes what Google documents: a gen2 function's Cloud Run service has
# the function's name, and a deterministic URL exists while SERVICE-PROJECT_NUMBER fits in one
# DNS label (63 characters; run/docs/triggering/https-request). Checked after apply.
check "timer_url_is_the_timer_services_run_app_url" {
  assert {
    condition     = reverse(split("/", module.timer.service))[0] == local.names.timer && length("${local.names.timer}-${data.google_project.this.number}") <= 63
    error_message = "The timer's Cloud Run service is ${module.timer.service}, not ${local.names.timer} with a deterministic URL: Cloud Tasks would call ${local.timer_url} in vain; set OPENDWS_TIMER_URL to its run.app URL."
  }
}

# The same for the agent function: the VMs call it at local.agent_url and name that URL as
# their identity tokens' audience.
check "agent_url_is_the_agent_services_run_app_url" {
  assert {
    condition     = reverse(split("/", module.agent.service))[0] == local.names.agent && length("${local.names.agent}-${data.google_project.this.number}") <= 63
    error_message = "The agent function's Cloud Run service is ${module.agent.service}, not ${local.names.agent} with a deterministic URL: the VMs would call ${local.agent_url} in vain; set OPENDWS_AGENT_URL to its run.app URL."
  }
}

# IAP's load balancer reaches the api through a serverless NEG that names the Cloud Run service
# by the function's name, as Google names a gen2 function's service (checked after apply).
check "api_iap_neg_names_the_api_service" {
  assert {
    condition     = var.api_iap == null || reverse(split("/", module.api.service))[0] == local.names.api
    error_message = "The api's Cloud Run service is ${module.api.service}, not ${local.names.api}: IAP's load balancer would send calls to no service."
  }
}

# A pass that outlives its invocation is cut off mid-write (safe, but wasted): the function's
# timeout must hold the follow-up window and a full pass after it.
check "reconcile_timeout_holds_follow_up" {
  assert {
    condition     = var.reconcile_timeout_seconds >= var.reconcile_follow_up_seconds + 30
    error_message = "reconcile_timeout_seconds (${var.reconcile_timeout_seconds}) must be at least reconcile_follow_up_seconds (${var.reconcile_follow_up_seconds}) + 30 s for the last pass."
  }
}
