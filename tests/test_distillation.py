"""DeiT's distillation loss, the distilled student's two heads, and a teacher that never learns."""
import timm
import torch
import torch.nn.functional as F
from torch import nn

from attnft.training.distillation import DistillationLoss, TeacherInput, distillation_term, is_distilled_student

TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)


def same_input(size=(32, 32)):
    return TeacherInput(size=size, student_mean=(0.5,) * 3, student_std=(0.5,) * 3,
                        teacher_mean=(0.5,) * 3, teacher_std=(0.5,) * 3)


class FixedTeacher(nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.logits = logits
        self.weight = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return self.logits * self.weight


def test_hard_loss_is_half_ce_on_labels_plus_half_ce_on_the_teachers_argmax():
    torch.manual_seed(0)
    z_cls, z_dist, teacher = torch.randn(6, 5), torch.randn(6, 5), torch.randn(6, 5)
    labels = torch.randint(0, 5, (6,))
    loss = DistillationLoss(nn.CrossEntropyLoss(), FixedTeacher(teacher), same_input(), "hard")
    expected = 0.5 * F.cross_entropy(z_cls, labels) + 0.5 * F.cross_entropy(z_dist, teacher.argmax(1))
    assert torch.equal(loss(torch.zeros(6, 3, 32, 32), (z_cls, z_dist), labels), expected)


def test_soft_loss_is_deits_kl_at_temperature_tau_with_weight_alpha():
    torch.manual_seed(1)
    z, teacher, labels = torch.randn(4, 5), torch.randn(4, 5), torch.tensor([0, 1, 2, 3])
    tau, alpha = 3.0, 0.7
    loss = DistillationLoss(nn.CrossEntropyLoss(), FixedTeacher(teacher), same_input(), "soft", alpha, tau)
    # deit/losses.py, written out: KL(teacher || student) summed, x tau^2, / numel
    p_t = F.softmax(teacher / tau, 1)
    kl = (p_t * (F.log_softmax(teacher / tau, 1) - F.log_softmax(z / tau, 1))).sum() * tau ** 2 / z.numel()
    expected = (1 - alpha) * F.cross_entropy(z, labels) + alpha * kl
    assert torch.allclose(loss(torch.zeros(4, 3, 32, 32), z, labels), expected, atol=1e-6)
    assert torch.allclose(distillation_term(z, teacher, "soft", tau), kl, atol=1e-6)


def distilled_student():
    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, **TINY)
    model.set_distilled_training(True)
    return model.train()


def test_the_distillation_head_learns_only_from_the_teacher_and_the_class_head_only_from_labels():
    student = distilled_student()
    assert is_distilled_student(student)
    teacher = timm.create_model("vit_tiny_patch16_224", pretrained=False, **TINY)
    images, labels = torch.randn(4, 3, 32, 32), torch.randint(0, 5, (4,))
    z_cls, z_dist = student(images)
    ce = nn.CrossEntropyLoss()
    loss = DistillationLoss(ce, teacher, same_input(), "hard")
    label_term = torch.autograd.grad(ce(z_cls, labels), [student.head.weight, student.head_dist.weight],
                                     retain_graph=True, allow_unused=True, materialize_grads=True)
    teacher_term = torch.autograd.grad(distillation_term(z_dist, loss.teacher_logits(images), "hard", 1.0),
                                       [student.head.weight, student.head_dist.weight], retain_graph=True,
                                       allow_unused=True, materialize_grads=True)
    assert label_term[1].abs().sum() == 0 and label_term[0].abs().sum() > 0
    assert teacher_term[0].abs().sum() == 0 and teacher_term[1].abs().sum() > 0


def test_the_teacher_stays_frozen_in_eval_mode_through_training_steps():
    student = distilled_student()
    teacher = timm.create_model("vit_tiny_patch16_224", pretrained=False, drop_rate=0.5, **TINY)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    loss_fn = DistillationLoss(nn.CrossEntropyLoss(), teacher, same_input(), "soft")
    loss_fn.train()
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        images, labels = torch.randn(4, 3, 32, 32), torch.randint(0, 5, (4,))
        loss_fn(images, student(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert not teacher.training  # dropout off: the teacher's labels are deterministic
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())


def test_a_distilled_student_predicts_with_the_average_of_both_heads_at_eval():
    student = distilled_student().eval()
    images = torch.randn(3, 3, 32, 32)
    tokens = student.forward_features(images)
    average = (student.head(tokens[:, 0]) + student.head_dist(tokens[:, 1])) / 2
    assert torch.allclose(student(images), average, atol=1e-6)


def test_the_teacher_sees_the_batch_at_its_own_size_and_normalisation():
    imagenet = dict(teacher_mean=(0.485, 0.456, 0.406), teacher_std=(0.229, 0.224, 0.225))
    pixels = torch.rand(2, 3, 32, 32)
    student_batch = (pixels - 0.5) / 0.5
    mean, std = torch.tensor(imagenet["teacher_mean"]).view(1, 3, 1, 1), torch.tensor(imagenet["teacher_std"]).view(1, 3, 1, 1)
    renormalised = TeacherInput(size=(32, 32), student_mean=(0.5,) * 3, student_std=(0.5,) * 3, **imagenet)
    assert torch.allclose(renormalised(student_batch), (pixels - mean) / std, atol=1e-5)
    resized = TeacherInput(size=(64, 64), student_mean=(0.5,) * 3, student_std=(0.5,) * 3, **imagenet)(student_batch)
    assert resized.shape == (2, 3, 64, 64)
    assert torch.allclose(resized.mean((2, 3)), ((pixels - mean) / std).mean((2, 3)), atol=0.02)
    same = same_input()
    assert same(student_batch) is student_batch  # nothing to do: no copy
