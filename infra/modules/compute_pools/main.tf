# Optional: the flex-start instance templates of MIG pools, made by Terraform rather than by
# the reconciler on first use, so that a team can choose the VMs' image, disk, network and
# service account. The name is the one the MIG provider looks up
# (opendws.adapters.mig.base_template_name): `odws-{shape}-flex`, labelled
# `opendws-template = base`, so the reconciler finds it and makes the pool's VMs from it: from
# its properties plus what every job VM needs (the agent's startup-script and the
# opendws-agent-url attribute; the job VMs' account where it names none), as a template of its
# own named by their digest. It never deletes this one.
#
# The pools' managed instance groups (`odws-{shape}` in each zone) are made by the reconciler
# on first use (opendws.adapters.mig), from this template, without bulk mode: a MIG in bulk
# mode takes no resize requests (compute/docs/instance-groups/about-bulk-mode), and a resize
# request creates its VMs all at once by itself. The reconciler reads the template back and
# refuses one whose provisioning model is not FLEX_START.

locals {
  pools = { for pool in var.flex_pools : pool.shape => pool }

  # The boot disk and NIC each machine family needs, as opendws.catalog.VM_PROFILES has them
  # (the reconciler's templates use the same table; tests/unit/test_infra.py keeps the two
  # equal): A3 Ultra and A4 boot only from Hyperdisk and need gVNIC
  # (ai-hypercomputer/docs/create/create-vm), A3 High and Mega need gVNIC; the others take a
  # balanced persistent disk and the default NIC. Keyed by machine-type prefix.
  vm_profiles = {
    "a4-"         = { disk_type = "hyperdisk-balanced", nic_type = "GVNIC" }
    "a3-ultragpu" = { disk_type = "hyperdisk-balanced", nic_type = "GVNIC" }
    "a3-megagpu"  = { disk_type = "pd-balanced", nic_type = "GVNIC" }
    "a3-highgpu"  = { disk_type = "pd-balanced", nic_type = "GVNIC" }
  }
  default_vm_profile = { disk_type = "pd-balanced", nic_type = null }
  profiles = {
    for shape in keys(local.pools) : shape => concat(
      [for prefix, profile in local.vm_profiles : profile if startswith(shape, prefix)],
      [local.default_vm_profile],
    )[0]
  }
}

resource "google_compute_instance_template" "flex" {
  for_each = local.pools

  project      = var.project
  name         = "odws-${each.key}-flex"
  description  = "opendws flex-start VMs of ${each.key}"
  machine_type = each.key
  labels       = merge(var.labels, { "managed-by" = "opendws", "opendws-template" = "base" })

  scheduling {
    provisioning_model          = "FLEX_START"
    instance_termination_action = "DELETE"
    on_host_maintenance         = "TERMINATE"
    automatic_restart           = false

    # The ceiling (7 days); each resize request asks for its own run duration.
    max_run_duration {
      seconds = 604800
    }
  }

  # Flex-start capacity is not taken from reservations (Google's own resize-request sample,
  # cluster-toolkit and SkyPilot all set this).
  reservation_affinity {
    type = "NO_RESERVATION"
  }

  disk {
    boot         = true
    auto_delete  = true
    source_image = coalesce(each.value.boot_image, var.boot_image)
    disk_size_gb = each.value.disk_size_gb
    disk_type    = local.profiles[each.key].disk_type
  }

  network_interface {
    network    = each.value.subnetwork == null ? each.value.network : null
    subnetwork = each.value.subnetwork
    nic_type   = local.profiles[each.key].nic_type
  }

  dynamic "guest_accelerator" {
    # A3, A4 and G2 machine types carry their GPUs; N1 types name theirs here.
    for_each = each.value.accelerator == null ? [] : [each.value.accelerator]
    content {
      type  = guest_accelerator.value.type
      count = guest_accelerator.value.count
    }
  }

  dynamic "service_account" {
    for_each = each.value.service_account == null && var.default_service_account == null ? [] : [coalesce(each.value.service_account, var.default_service_account)]
    content {
      email  = service_account.value
      scopes = ["cloud-platform"]
    }
  }

  metadata = {
    block-project-ssh-keys = "true"
    enable-oslogin         = "TRUE"
  }

  shielded_instance_config {
    enable_secure_boot          = each.value.secure_boot
    enable_vtpm                 = true
    enable_integrity_monitoring = true
  }
}
